//! Evaluating policy versions without letting them decide anything: the
//! swap-time probe and the conformance suite (`conformance`), shadow runs
//! on live traffic (`shadow`), and off-policy replay of a node's decision
//! log (`replay`), and scoring on a labelled dataset (`dataset`, with the
//! curves of `curve`, run and drawn by `dataset_cli` and `plot`).

pub mod cases;
pub mod conformance;
pub mod curve;
pub mod dataset;
pub mod dataset_cli;
pub mod plot;
pub mod replay;
pub mod shadow;
