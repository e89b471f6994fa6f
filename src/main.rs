//! The `speedtap` binary: the headless engine and CLI.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") | Some("-V") => println!("speedtap {}", env!("CARGO_PKG_VERSION")),
        _ => {
            println!(
                "speedtap {}\n\nUsage: speedtap [--version]\n\nThe interceptor (`speedtap run`) is coming.",
                env!("CARGO_PKG_VERSION")
            );
        }
    }
}
