//! The CRI container log format, as kubelet's runtimes write it under `/var/log/pods`:
//! one line per record, `<RFC3339Nano> <stdout|stderr> <F|P> <message>`, where `P` marks a partial
//! line continued by the next record of the same stream and `F` ends it.

/// One parsed log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub(crate) time: &'a str,
    pub(crate) stream: &'a str,
    /// `false` for a `P` (partial) record.
    pub(crate) full: bool,
    pub(crate) message: &'a str,
}

/// Parse one record; `None` for a line that is not in the CRI format.
pub(crate) fn parse_line(line: &str) -> Option<Record<'_>> {
    let mut parts = line.splitn(4, ' ');
    let (time, stream, tag) = (parts.next()?, parts.next()?, parts.next()?);
    // An empty message is written without its separating space.
    let message = parts.next().unwrap_or("");
    if !matches!(stream, "stdout" | "stderr") || time.is_empty() {
        return None;
    }
    let full = match tag.split(':').next()? {
        "F" => true,
        "P" => false,
        _ => return None,
    };
    Some(Record { time, stream, full, message })
}

/// The last `lines` logical lines of a CRI log file's text, partial records joined, each as
/// `<time> <stream> <message>`. Lines not in the format are kept as they are (a runtime that
/// writes plain text is still readable).
pub(crate) fn tail(text: &str, lines: usize) -> String {
    let mut out: Vec<String> = Vec::new();
    // Partial records wait here, per stream, for the record that ends them.
    let mut pending: [(String, String); 2] = Default::default();
    for raw in text.lines() {
        let Some(r) = parse_line(raw) else {
            out.push(raw.to_string());
            continue;
        };
        let slot = &mut pending[usize::from(r.stream == "stderr")];
        if slot.0.is_empty() {
            slot.0 = r.time.to_string();
        }
        slot.1.push_str(r.message);
        if r.full {
            let (time, message) = std::mem::take(slot);
            out.push(format!("{time} {} {message}", r.stream));
        }
    }
    // A partial line at the end of the file is the last thing the worker wrote: keep it.
    for ((time, message), stream) in pending.into_iter().zip(["stdout", "stderr"]) {
        if !time.is_empty() {
            out.push(format!("{time} {stream} {message}"));
        }
    }
    out[out.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_with_their_tag() {
        let r = parse_line("2026-11-30T02:14:00.123456789Z stdout F step 41 done").unwrap();
        assert_eq!(r.time, "2026-11-30T02:14:00.123456789Z");
        assert_eq!((r.stream, r.full, r.message), ("stdout", true, "step 41 done"));
        let p = parse_line("2026-11-30T02:14:00Z stderr P half a").unwrap();
        assert!(!p.full);
        assert_eq!(parse_line("2026-11-30T02:14:00Z stdout F").unwrap().message, "");
        for bad in ["", "hello world", "t stdout X msg", "t stdweird F msg"] {
            assert!(parse_line(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn partial_records_join_per_stream_and_the_tail_is_bounded() {
        let text = "\
t1 stdout P hel
t2 stderr F oops
t3 stdout P lo wor
t4 stdout F ld
t5 stdout F line 2
not a cri line
t6 stderr P cut off";
        assert_eq!(
            tail(text, 10),
            "t2 stderr oops\nt1 stdout hello world\nt5 stdout line 2\nnot a cri line\nt6 stderr cut off"
        );
        assert_eq!(tail(text, 2), "not a cri line\nt6 stderr cut off");
        assert_eq!(tail("", 5), "");
    }
}
