//! Parsing the three watched keys' bodies into typed values. Pure and strict: an unknown value
//! is an error (the previous value stays published) rather than a guess, so a new server answer
//! can never read as a false "all clear"; every accepted spelling is a table row in the tests.

use serde::Deserialize;

use super::{
    snippet, MetadataError, MAINTENANCE_EVENT_PATH, NO_NOTIFICATIONS, PREEMPTED_PATH,
    UPCOMING_MAINTENANCE_PATH,
};
use crate::vocab::maintenance::{MaintenanceEvent, UpcomingMaintenance, UpcomingStatus};

/// Parse `instance/maintenance-event`. Only the documented values are accepted: an unknown one
/// must not be mistaken for `NONE` (a false "all clear") nor for an event.
pub(crate) fn parse_maintenance_event(body: &str) -> Result<MaintenanceEvent, MetadataError> {
    MaintenanceEvent::parse(body).ok_or_else(|| {
        let detail = format!(
            "expected NONE, MIGRATE_ON_HOST_MAINTENANCE or TERMINATE_ON_HOST_MAINTENANCE, got {:?}",
            snippet(body.trim())
        );
        MetadataError::malformed(MAINTENANCE_EVENT_PATH, detail)
    })
}

/// Parse `instance/preempted` (`TRUE`/`FALSE`; case is ignored).
pub(crate) fn parse_preempted(body: &str) -> Result<bool, MetadataError> {
    let v = body.trim();
    v.to_ascii_lowercase().parse().map_err(|_| {
        let detail = format!("expected TRUE or FALSE, got {:?}", snippet(v));
        MetadataError::malformed(PREEMPTED_PATH, detail)
    })
}

/// `instance/upcoming-maintenance` as the server writes it (snake_case), with the REST API's
/// camelCase spellings accepted too, since some tools relay that form.
#[derive(Debug, Deserialize)]
struct UpcomingWire {
    /// The "no notifications have been received yet" answer is an error object.
    error: Option<String>,
    #[serde(alias = "maintenanceStatus")]
    maintenance_status: Option<UpcomingStatus>,
    #[serde(default, alias = "canReschedule", deserialize_with = "string_bool")]
    can_reschedule: bool,
    #[serde(rename = "type", alias = "maintenance_type", alias = "maintenanceType")]
    maintenance_type: Option<String>,
    #[serde(alias = "windowStartTime")]
    window_start_time: Option<String>,
    #[serde(alias = "windowEndTime")]
    window_end_time: Option<String>,
    #[serde(alias = "latestWindowStartTime")]
    latest_window_start_time: Option<String>,
    #[serde(alias = "maintenanceReasons")]
    maintenance_reasons: Option<Vec<String>>,
    /// Fields this version does not know: tolerated, but an object of nothing else is no notice.
    #[serde(flatten)]
    other: std::collections::BTreeMap<String, serde::de::IgnoredAny>,
}

/// `can_reschedule` arrives as the *string* `"true"`/`"false"` (any case); a JSON bool or null is
/// accepted too.
fn string_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum BoolOrString {
        Bool(bool),
        String(String),
    }
    match Option::<BoolOrString>::deserialize(d)? {
        None => Ok(false),
        Some(BoolOrString::Bool(b)) => Ok(b),
        Some(BoolOrString::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(BoolOrString::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(BoolOrString::String(s)) => Err(serde::de::Error::custom(format!(
            "can_reschedule should be \"true\" or \"false\", got {s:?}"
        ))),
    }
}

/// Parse `instance/upcoming-maintenance`. `Ok(None)` means nothing is scheduled: an empty body,
/// `{ }`, the literal `NONE`, or the "no notifications have been received yet" error object.
/// A status other than PENDING/ONGOING is rejected (malformed) rather than guessed at, so the
/// previous value is kept.
pub(crate) fn parse_upcoming(body: &str) -> Result<Option<UpcomingMaintenance>, MetadataError> {
    let text = body.trim();
    if text.is_empty() || text == "NONE" {
        return Ok(None);
    }
    let bad = |detail: String| MetadataError::malformed(UPCOMING_MAINTENANCE_PATH, detail);
    let wire: UpcomingWire =
        serde_json::from_str(text).map_err(|e| bad(format!("{e}: {:?}", snippet(text))))?;
    match &wire.error {
        Some(err) if err.contains(NO_NOTIFICATIONS) => return Ok(None),
        Some(err) => return Err(bad(format!("server reported an error: {:?}", snippet(err)))),
        None => {}
    }
    let Some(status) = wire.maintenance_status else {
        let nothing = wire.other.is_empty()
            && wire.maintenance_type.is_none()
            && wire.window_start_time.is_none()
            && wire.window_end_time.is_none();
        if nothing {
            return Ok(None);
        }
        return Err(bad(format!("no maintenance_status in {:?}", snippet(text))));
    };
    Ok(Some(UpcomingMaintenance {
        maintenance_type: wire.maintenance_type,
        status,
        can_reschedule: wire.can_reschedule,
        window_start: wire.window_start_time,
        window_end: wire.window_end_time,
        latest_window_start: wire.latest_window_start_time,
        reasons: wire.maintenance_reasons.unwrap_or_default(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use UpcomingStatus::{Ongoing as ONGOING, Pending as PENDING};

    #[test]
    fn maintenance_event_values() {
        use MaintenanceEvent as E;
        for (body, want) in [
            ("NONE", E::None),
            ("MIGRATE_ON_HOST_MAINTENANCE", E::MigrateOnHostMaintenance),
            ("TERMINATE_ON_HOST_MAINTENANCE", E::TerminateOnHostMaintenance),
            ("  NONE\n", E::None),
        ] {
            assert_eq!(parse_maintenance_event(body).ok(), Some(want));
        }
        for bad in ["BANANA", "", "none", "TERMINATE"] {
            let e = parse_maintenance_event(bad).unwrap_err();
            assert_eq!(e.kind(), "malformed", "{bad:?}");
        }
    }

    #[test]
    fn preempted_values() {
        assert_eq!(parse_preempted("TRUE").ok(), Some(true));
        assert_eq!(parse_preempted("FALSE\n").ok(), Some(false));
        assert_eq!(parse_preempted("true").ok(), Some(true));
        for bad in ["MAYBE", "", "1", "yes"] {
            assert_eq!(parse_preempted(bad).unwrap_err().kind(), "malformed", "{bad:?}");
        }
    }

    /// The example answer in Google's host-events guide.
    const GCE_EXAMPLE: &str = r#"{
        "can_reschedule": "true",
        "latest_window_start_time": "2024-12-01T19:00:01Z",
        "maintenance_reasons": ["PLANNED_UPDATE", "PLANNED_NETWORK_UPDATE"],
        "maintenance_status": "PENDING",
        "type": "SCHEDULED",
        "window_end_time": "2024-12-01T21:00:01Z",
        "window_start_time": "2024-12-01T19:00:01Z"
    }"#;

    #[test]
    fn upcoming_gce_example() {
        let u = parse_upcoming(GCE_EXAMPLE).unwrap().unwrap();
        assert_eq!(
            u,
            UpcomingMaintenance {
                maintenance_type: Some("SCHEDULED".into()),
                status: PENDING,
                can_reschedule: true,
                window_start: Some("2024-12-01T19:00:01Z".into()),
                window_end: Some("2024-12-01T21:00:01Z".into()),
                latest_window_start: Some("2024-12-01T19:00:01Z".into()),
                reasons: vec!["PLANNED_UPDATE".into(), "PLANNED_NETWORK_UPDATE".into()],
            }
        );
    }

    #[test]
    fn upcoming_table() {
        // (body, Ok(Some((status, can_reschedule))) | Ok(None) | Err)
        type Want = Result<Option<(UpcomingStatus, bool)>, ()>;
        let table: &[(&str, Want)] = &[
            ("", Ok(None)),
            ("  \n", Ok(None)),
            ("{ }", Ok(None)),
            ("{}", Ok(None)),
            ("NONE", Ok(None)),
            (
                r#"{ "error": "no notifications have been received yet, try again later" }"#,
                Ok(None),
            ),
            (
                r#"{"maintenance_status":"ONGOING","can_reschedule":"false"}"#,
                Ok(Some((ONGOING, false))),
            ),
            (
                r#"{"maintenance_status":"PENDING","can_reschedule":true}"#,
                Ok(Some((PENDING, true))),
            ),
            (
                r#"{"maintenance_status":"PENDING","can_reschedule":"TRUE"}"#,
                Ok(Some((PENDING, true))),
            ),
            (r#"{"maintenance_status":"PENDING"}"#, Ok(Some((PENDING, false)))),
            (r#"{"maintenanceStatus":"ONGOING","canReschedule":true}"#, Ok(Some((ONGOING, true)))),
            ("{not json", Err(())),
            ("BANANA", Err(())),
            ("[]", Err(())),
            ("\"PENDING\"", Err(())),
            (r#"{"foo": 1}"#, Err(())),
            (r#"{"maintenance_status":"BANANA"}"#, Err(())),
            (r#"{"maintenance_status":7}"#, Err(())),
            (r#"{"maintenance_status":"PENDING","can_reschedule":"maybe"}"#, Err(())),
            (r#"{"maintenance_status":"PENDING","maintenance_reasons":"x"}"#, Err(())),
            (r#"{"error": "internal"}"#, Err(())),
        ];
        for (body, want) in table {
            let got = parse_upcoming(body);
            match (want, got) {
                (Ok(None), Ok(None)) => {}
                (Ok(Some((status, resched))), Ok(Some(u))) => {
                    assert_eq!(u.status, *status, "{body}");
                    assert_eq!(u.can_reschedule, *resched, "{body}");
                }
                (Err(()), Err(e)) => assert_eq!(e.kind(), "malformed", "{body}"),
                (want, got) => panic!("{body}: want {want:?}, got {got:?}"),
            }
        }
    }
}
