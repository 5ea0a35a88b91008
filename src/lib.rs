pub mod broker;
pub mod client;
pub mod config;
pub mod fsync;
pub mod log;
pub mod reactor;
pub mod session;
pub mod wire;
