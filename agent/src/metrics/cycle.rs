//! The evaluation cycle and what it depends on: the coordinator's and the runtime's health, the
//! cycle itself (workers seen, observe mode, duration), and the restart budgets it reads.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// The coordinator (Redis) and the container runtime: errors, and whether the last call worked.
#[derive(Default)]
pub(crate) struct BackendMetrics {
    pub(crate) coordinator_errors: Counter,
    pub(crate) runtime_errors: Counter,
    pub(crate) coordinator_up: Gauge,
    pub(crate) runtime_up: Gauge,
}

impl BackendMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = BackendMetrics::default();
        register!(reg;
            "coordinator_errors" => m.coordinator_errors,
                "Coordinator (Redis) errors; restarts pause while it is unreachable";
            "runtime_errors" => m.runtime_errors, "Container runtime (Docker) errors";
            "coordinator_up" => m.coordinator_up,
                "1 when the last cycle went through at the coordinator, its writes included";
            "runtime_up" => m.runtime_up, "1 when the last container runtime call succeeded";
        );
        m
    }

    pub(crate) fn coordinator_error(&self) {
        self.coordinator_errors.inc();
    }
    pub(crate) fn set_coordinator_up(&self, up: bool) {
        self.coordinator_up.set(i64::from(up));
    }
    pub(crate) fn runtime_error(&self) {
        self.runtime_errors.inc();
    }
    pub(crate) fn set_runtime_up(&self, up: bool) {
        self.runtime_up.set(i64::from(up));
    }
}

/// One evaluation cycle.
pub(crate) struct CycleMetrics {
    pub(crate) workers: Gauge,
    pub(crate) dry_run: Gauge,
    pub(crate) cycle_seconds: Histogram,
}

impl CycleMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let cycle_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let (workers, dry_run) = (Gauge::default(), Gauge::default());
        let m = CycleMetrics { workers, dry_run, cycle_seconds };
        register!(reg;
            "workers" => m.workers, "Opted-in worker containers seen in the last cycle";
            "dry_run" => m.dry_run, "1 when the agent runs in observe mode (restarts never run)";
            "cycle_duration" in Unit::Seconds => m.cycle_seconds,
                "Duration of one evaluation cycle";
        );
        m
    }

    pub(crate) fn set_workers(&self, n: usize) {
        self.workers.set(n as i64);
    }
    pub(crate) fn set_dry_run(&self, on: bool) {
        self.dry_run.set(i64::from(on));
    }
    /// One cycle took `seconds`.
    pub(crate) fn observe(&self, seconds: f64) {
        self.cycle_seconds.observe(seconds);
    }
}

/// The node's circuit breaker and the fleet budget, as the last cycle read them.
#[derive(Default)]
pub(crate) struct BudgetMetrics {
    pub(crate) breaker_used: Gauge,
    pub(crate) breaker_open: Gauge,
    pub(crate) breaker_limit: Gauge,
    pub(crate) fleet_budget_used: Gauge,
    pub(crate) fleet_budget_limit: Gauge,
    pub(crate) fleet_budget_exhausted: Gauge,
}

impl BudgetMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = BudgetMetrics::default();
        register!(reg;
            "breaker_used" => m.breaker_used,
                "Restarts used on this node in the current UTC day (the circuit breaker's count)";
            "breaker_open" => m.breaker_open,
                "1 when this node's breaker is open: no more restarts today, alerts only";
            "breaker_limit" => m.breaker_limit,
                "Restarts allowed on this node per UTC day (safety.breaker_per_day; 0 when the breaker is disabled)";
            "fleet_budget_used" => m.fleet_budget_used,
                "Restarts used across the fleet in the current budget window";
            "fleet_budget_limit" => m.fleet_budget_limit,
                "Restarts allowed across the fleet per budget window (safety.fleet_budget; 0 = no fleet cap)";
            "fleet_budget_exhausted" => m.fleet_budget_exhausted,
                "1 when the fleet budget of the current window is spent: no restart anywhere until the next window";
        );
        m
    }

    /// The configured caps: restarts per node per day (0 when disabled), per fleet window.
    pub(crate) fn set_limits(&self, breaker: Option<u32>, fleet: u32) {
        self.breaker_limit.set(i64::from(breaker.unwrap_or(0)));
        self.fleet_budget_limit.set(i64::from(fleet));
    }

    /// The breaker's count today, and whether that count opens it.
    pub(crate) fn set_breaker(&self, used: u64, open: bool) {
        self.breaker_used.set(used as i64);
        self.breaker_open.set(i64::from(open));
    }
    /// The fleet budget's count in this window, and whether that count spends it.
    pub(crate) fn set_fleet_budget(&self, used: u64, exhausted: bool) {
        self.fleet_budget_used.set(used as i64);
        self.fleet_budget_exhausted.set(i64::from(exhausted));
    }
}
