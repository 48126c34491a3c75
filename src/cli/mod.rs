//! Subcommand entry points: each parses its command line, sets up logging and calls the library.
pub mod launcher;
pub mod monitor;
