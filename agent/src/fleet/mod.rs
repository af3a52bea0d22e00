//! The fleet: each agent's node record in Redis (`heartbeat`, written once a cycle in the cycle's
//! one batch) and the fleet view read from them (`view`: `vigil status`, the per-slice rollup), and the gangs in it (`gangs`: each
//! distributed job's members, verdict, incident and decision).

pub(crate) mod gangs;
pub(crate) mod heartbeat;
pub mod view;
