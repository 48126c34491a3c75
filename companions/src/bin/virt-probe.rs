//! `virt-probe` (in PATH) of the launcher image: see [`companions::probe`].

fn main() {
    std::process::exit(companions::probe::main())
}
