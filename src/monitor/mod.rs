//! PID 1 of the compute container, as KubeVirt's virt-launcher-monitor.
//!
//! Becomes child subreaper, starts the launcher, reaps every zombie without stealing the exit status
//! of children that others wait on, forwards termination signals, enforces the grace period on
//! QEMU, removes the container-disk sockets and exits with the launcher's code.
