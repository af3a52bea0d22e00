//! A check of the node as `vigil doctor` prints it: a name, `ok` / `warn` / `FAIL`, and what to do.
//! The doctor's checks (`super::doctor`) and the ones it borrows (`super::idle`, `super::budget`)
//! all speak this one type, so none of them imports another.

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum Level {
    Ok,
    Warn,
    #[strum(serialize = "FAIL")]
    Fail,
}

as_str!(pub Level);

/// One check's result.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    pub(crate) name: String,
    pub(crate) level: Level,
    pub(crate) detail: String,
}

/// A check whose level is worked out (for a fixed one: [`Check::ok`], [`Check::warn`],
/// [`Check::fail`]).
pub(super) fn check(name: impl Into<String>, level: Level, detail: impl Into<String>) -> Check {
    Check { name: name.into(), level, detail: detail.into() }
}

impl Check {
    pub(super) fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
        check(name, Level::Ok, detail)
    }

    pub(super) fn warn(name: impl Into<String>, detail: impl Into<String>) -> Check {
        check(name, Level::Warn, detail)
    }

    pub(super) fn fail(name: impl Into<String>, detail: impl Into<String>) -> Check {
        check(name, Level::Fail, detail)
    }
}

/// The report, one line per check.
pub(crate) fn render(checks: &[Check]) -> String {
    let line = |c: &Check| format!("{:<5} {:<12} {}\n", c.level.as_str(), c.name, c.detail);
    let mut s: String = checks.iter().map(line).collect();
    let worst = checks.iter().map(|c| c.level).max().unwrap_or(Level::Ok);
    s.push_str(match worst {
        Level::Ok => "\nall checks passed\n",
        Level::Warn => "\nno failures; read the warnings\n",
        Level::Fail => "\nsome checks FAILED: the agent cannot do its job until they are fixed\n",
    });
    s
}
