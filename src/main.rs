//! The `speedtap` binary: the headless engine and CLI. All the work is in
//! the library (`speedtap::cli`), so tests can drive it too.

fn main() {
    std::process::exit(speedtap::cli::commands::main_with_args(std::env::args_os()));
}
