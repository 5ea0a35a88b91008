//! What an error says: the registry's name, retry class and advice.
//! `cargo run --example errors [BROKER]`
use mortarmq::client::{ErrorCode, Producer};

fn main() -> Result<(), mortarmq::client::Error> {
    let broker = std::env::args().nth(1).unwrap_or("127.0.0.1:7411".into());
    let mut producer = Producer::connect(&broker)?; // without .declare(): topics must exist
    match producer.publish("no-such-topic", "", "x", None) {
        Err(e) if e.code() == Some(ErrorCode::UnknownTopic) => {
            // UNKNOWN_TOPIC No - DECLARE the topic, or refresh the id
            println!("{} {:?} - {}", e.name(), e.retry(), e.client_should());
            Ok(())
        }
        other => panic!("expected UNKNOWN_TOPIC, got {other:?}"),
    }
}
