//! `mortarctl`: the MortarMQ operator CLI. This first version speaks the wire
//! protocol for `ping`; the read path over admin HTTP and the topic, pub and sub
//! subcommands land with the operator-surface work (issue 6).

use std::process::ExitCode;

use mortarmq::client::Client;

const EXIT_BROKER_ERROR: u8 = 1;
const EXIT_USAGE: u8 = 2;
const BROKER_DEFAULT: &str = "127.0.0.1:7411";

fn usage() -> String {
    format!(
        "usage: mortarctl [--broker ADDR] [--token TOKEN] ping\n\
         \n  --broker ADDR   broker address (default {BROKER_DEFAULT})\n\
         \x20 --token TOKEN   CONNECT token (default empty)\n"
    )
}

fn main() -> ExitCode {
    let mut opts = getopts::Options::new();
    opts.optopt("", "broker", "broker address", "ADDR");
    opts.optopt("", "token", "CONNECT token", "TOKEN");
    opts.optflag("h", "help", "this help");
    let m = match opts.parse(std::env::args().skip(1)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("mortarctl: {e}\n{}", usage());
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if m.opt_present("help") {
        print!("{}", usage());
        return ExitCode::SUCCESS;
    }
    let broker = m
        .opt_str("broker")
        .unwrap_or_else(|| BROKER_DEFAULT.to_string());
    let token = m.opt_str("token").unwrap_or_default();
    match m.free.first().map(String::as_str) {
        Some("ping") => {
            let started = std::time::Instant::now();
            match Client::connect(broker.as_str(), token.as_bytes()).and_then(|mut c| c.ping()) {
                Ok(()) => {
                    println!("pong from {broker} in {:?}", started.elapsed());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("mortarctl: {e}");
                    ExitCode::from(EXIT_BROKER_ERROR)
                }
            }
        }
        _ => {
            eprint!("{}", usage());
            ExitCode::from(EXIT_USAGE)
        }
    }
}
