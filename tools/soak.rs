//! Placeholder: built by the reliability work (issue 8).
fn main() {
    eprintln!("not built yet");
    std::process::exit(2);
}
