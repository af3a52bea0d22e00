//! The node's cycle, above the features it drives: every `poll_interval` the opted-in workers
//! are listed, read in one round trip, judged and, when hung, handed to the restart path
//! (`crate::hang`), and the node's record goes out with the cycle's writes (`crate::fleet`),
//! standing down while maintenance, a failed accelerator or a drain says so
//! (`crate::vocab::stand_down`). `agent` is the loop; `vigil run` wires it (`crate::app`).

pub mod agent;
