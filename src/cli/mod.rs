//! The command line: argument parsing, the `run`, `simulate` and
//! `discover` commands, and what `run` prints.

pub mod args;
pub mod commands;
pub mod run;
pub mod view;
