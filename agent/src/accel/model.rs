//! What every accelerator kind (GPU, TPU) has in common: one health scale.

use strum::{IntoStaticStr, VariantArray};

/// Health of one accelerator, or of a node's accelerators of one kind.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, IntoStaticStr, VariantArray,
)]
#[strum(serialize_all = "kebab-case")]
pub enum Health {
    #[default]
    Healthy,
    /// Still usable, with a reason worth a look.
    Degraded,
    /// Cannot run its workload: a restart cannot fix it.
    Failed,
}

as_str!(pub Health);
