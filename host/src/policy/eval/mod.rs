//! Evaluating policy versions without letting them decide anything: the
//! swap-time probe and the conformance suite (`conformance`), shadow runs
//! on live traffic (`shadow`), and off-policy replay of a node's decision
//! log (`replay`).

pub mod conformance;
pub mod replay;
pub mod shadow;
