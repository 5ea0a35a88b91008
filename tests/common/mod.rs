pub mod consume;
pub mod golden;
pub mod mortard;
pub mod rng;
pub mod wait;
