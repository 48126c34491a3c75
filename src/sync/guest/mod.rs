//! The guest side: the QEMU guest agent ([`agent`], its errors in [`error`]), domain statistics
//! ([`stats`]) and the domain information the cmd API's info RPCs read ([`info`]).

pub mod agent;
pub mod error;
pub mod info;
pub mod stats;
