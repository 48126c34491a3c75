//! Passes that run after every configurator, each documenting the plan fields it reads and writes
//! (instead of hidden order coupling between configurators).

pub mod launch_security;
pub mod pci;
