//! `/usr/bin/virt-freezer` of the launcher image: see [`companions::freezer`].

fn main() {
    std::process::exit(companions::freezer::main())
}
