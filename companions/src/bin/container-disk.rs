//! `/usr/bin/container-disk` of the launcher image: see [`companions::container_disk`].

fn main() {
    companions::container_disk::main()
}
