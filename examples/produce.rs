//! Publishes to `orders` (created with 4 partitions if missing): one record waited for
//! until it is on disk, then 1,000 pipelined and a record no consumer can parse.
//! `cargo run --example produce [BROKER]`
use mortarmq::client::{Durability, Producer};

fn main() -> Result<(), mortarmq::client::Error> {
    let broker = std::env::args().nth(1).unwrap_or("127.0.0.1:7411".into());
    let mut producer = Producer::builder(&broker).declare(4).connect()?;

    let receipt = producer.publish(
        "orders",
        "customer-42",
        r#"{"total": 12}"#,
        Durability::Fsynced,
    )?;
    println!(
        "partition {} sequence {}",
        receipt.partition, receipt.sequence
    );

    // Pipelined: `send` returns a handle at once, `flush` waits for every answer.
    let mut handles = Vec::new();
    for i in 0..1000 {
        handles.push(producer.send("orders", "", format!("line {i}"), None)?);
    }
    producer.send("orders", "", [0xff, 0xfe], None)?; // not UTF-8
    producer.flush()?;
    let last = handles[999].result().expect("answered after flush")?;
    println!(
        "line 999: partition {} sequence {}",
        last.partition, last.sequence
    );
    producer.close()
}
