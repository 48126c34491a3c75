"""scripts/bench in parts; `scripts/bench` is the entry point (its docstring is the
--help text).

`common` (paths, logging), `procs` (/proc), `host` (page cache, memory cgroup,
machine), `qmp`, `domain` (the VMI and its libvirt domain), `vm` (qlauncher and
bare QEMU runs), `libvirt`, `ops` (cargo benches), `soak`, `charts`, `report`,
`cli` (main: the phases in order).
"""
