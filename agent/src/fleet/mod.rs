//! The fleet: each agent's node record in Redis (`heartbeat`, written once a cycle in the cycle's
//! one batch) and the fleet view read from them (`view`: `vigil status`, the per-slice rollup), and the gangs in it (`gangs`: each
//! distributed job's members, verdict, incident and decision), and the time lost per pool (`lost`).

pub(crate) mod gangs;
pub(crate) mod heartbeat;
pub(crate) mod lost;
pub mod view;
