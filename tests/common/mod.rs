pub mod golden;
pub mod mortard;
