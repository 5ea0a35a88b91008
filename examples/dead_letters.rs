//! Reads the dead letters of `orders` from its twin `orders.dlq`, with their origin.
//! `cargo run --example dead_letters [BROKER]`
use std::time::Duration;

use mortarmq::client::{Consumer, StartPolicy};

fn main() -> Result<(), mortarmq::client::Error> {
    let broker = std::env::args().nth(1).unwrap_or("127.0.0.1:7411".into());
    let mut consumer = Consumer::connect(&broker)?;
    consumer.subscribe("billing-dlq", "orders.dlq", StartPolicy::Earliest)?;

    while let Some(m) = consumer.poll(Some(Duration::from_secs(2)))? {
        let origin = m.origin.clone().expect("a dead letter carries its origin");
        println!(
            "{:?} from {} partition {} sequence {} after {} attempt(s): {:?}",
            m.value,
            origin.topic.as_deref().unwrap_or("?"),
            origin.partition,
            origin.sequence,
            origin.attempts,
            origin.reason,
        );
        m.ack();
    }
    consumer.close()
}
