//! Consumes `orders` as a member of the group `billing` until 2 s pass without a
//! message: acknowledges each UTF-8 value, dead-letters (rejects) the rest.
//! `cargo run --example consume [BROKER]`
use std::time::Duration;

use mortarmq::client::{Consumer, StartPolicy};

fn main() -> Result<(), mortarmq::client::Error> {
    let broker = std::env::args().nth(1).unwrap_or("127.0.0.1:7411".into());
    let mut consumer = Consumer::connect(&broker)?;
    consumer.subscribe("billing", "orders", StartPolicy::Earliest)?;

    let (mut acked, mut rejected) = (0, 0);
    while let Some(m) = consumer.poll(Some(Duration::from_secs(2)))? {
        match std::str::from_utf8(&m.value) {
            Ok(_text) => acked += u32::from(m.ack()),
            Err(_) => rejected += u32::from(m.reject()), // to orders.dlq
        }
    }
    println!("acknowledged {acked}, rejected {rejected}");
    consumer.close() // waits for the answers, then leaves the group
}
