//! Evaluating policy versions without letting them decide anything: the
//! swap-time probe and the conformance suite (`conformance`), and shadow
//! runs on live traffic (`shadow`).

pub mod conformance;
pub mod shadow;
