//! `mortar-bench`: load generator and latency meter for MortarMQ (issue 7).
fn main() {
    eprintln!("mortar-bench: not built yet");
    std::process::exit(2);
}
