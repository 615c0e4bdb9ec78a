//! The front ends behind the `kvdrain` command, as a library so that tests and fuzz
//! targets drive exactly what the command runs.

pub mod json;
pub mod replay;
