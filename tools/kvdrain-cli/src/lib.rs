//! The front ends behind the `kvdrain` command, as a library so that tests and fuzz
//! targets drive exactly what the command runs.

pub mod bench;
pub mod command;
pub mod demo;
pub mod experiment;
pub mod progress;
pub mod replay;
pub mod sim;
