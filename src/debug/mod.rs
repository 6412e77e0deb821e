//! Instruments for when something goes wrong: the explain report of what a context
//! evaluated, and repro documents of failing invocations. (The debug and
//! fault-injection backends live with the execution engine, in `exec`.)

pub mod explain;
pub mod repro;
