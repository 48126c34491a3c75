//! `/usr/bin/virt-tail` of the launcher image: see [`companions::tail`].

fn main() {
    std::process::exit(companions::tail::main())
}
