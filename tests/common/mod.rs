pub mod cluster;
pub mod consume;
pub mod golden;
pub mod mortarctl;
pub mod mortard;
pub mod repo;
pub mod rng;
pub mod wait;
