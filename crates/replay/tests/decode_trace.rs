//! Trace parsing: the schema, malformed rows named by line, empty traces,
//! relative arrivals and the workload built from a trace.

use std::time::Duration;

use xtc_replay::job;
use xtc_replay::trace::{self, Scaling, TraceError};

const HEADER: &str = "TIMESTAMP,ContextTokens,GeneratedTokens\n";

fn row_error(text: &str) -> (u64, String) {
    match trace::parse(text).unwrap_err() {
        TraceError::Row { line, msg } => (line, msg),
        e => panic!("expected a row error, got {e}"),
    }
}

#[test]
fn arrivals_are_relative_to_the_first_row() {
    let t = trace::parse(&format!(
        "{HEADER}2023-11-16 23:59:59.5,10,2\n2023-11-17 00:00:01.0000001,20,3\n"
    ))
    .unwrap();
    assert_eq!(t.requests.len(), 2);
    assert_eq!(t.requests[0].arrival, Duration::ZERO);
    assert_eq!(t.requests[1].arrival, Duration::from_nanos(1_500_000_100));
    assert_eq!(
        (t.requests[1].prompt_tokens, t.requests[1].output_tokens),
        (20, 3)
    );
}

#[test]
fn columns_may_come_in_any_order() {
    let t =
        trace::parse("GeneratedTokens,TIMESTAMP,ContextTokens\r\n4,2023-11-16 18:15:46.68,9\r\n")
            .unwrap();
    assert_eq!(
        (t.requests[0].prompt_tokens, t.requests[0].output_tokens),
        (9, 4)
    );
}

#[test]
fn malformed_rows_name_their_line() {
    let ok = "2023-11-16 18:15:46.6805900,374,44\n";
    let (line, msg) = row_error(&format!("{HEADER}{ok}{ok}2023-11-16 18:15:47,abc,3\n"));
    assert_eq!(line, 4);
    assert!(
        msg.contains("ContextTokens") && msg.contains("abc"),
        "{msg}"
    );
    let (line, msg) = row_error(&format!("{HEADER}{ok}not a time,1,1\n"));
    assert_eq!(line, 3);
    assert!(msg.contains("TIMESTAMP"), "{msg}");
    let (line, _) = row_error(&format!("{HEADER}{ok}2023-11-16 18:15:47,5\n"));
    assert_eq!(line, 3);
    let (line, msg) = row_error(&format!("{HEADER}2023-11-16 18:15:47,5,0\n"));
    assert_eq!(line, 2);
    assert!(msg.contains("GeneratedTokens"), "{msg}");
    let (line, msg) = row_error(&format!("{HEADER}{ok}2023-11-16 18:15:40,5,5\n"));
    assert_eq!(line, 3);
    assert!(msg.contains("earlier"), "{msg}");
    let e = trace::parse(&format!("{HEADER}{ok}x,-1,2\n")).unwrap_err();
    assert!(e.to_string().starts_with("trace line 3:"), "{e}");
}

#[test]
fn empty_traces_and_wrong_headers_are_errors() {
    assert_eq!(trace::parse(""), Err(TraceError::Empty));
    assert_eq!(trace::parse(HEADER), Err(TraceError::Empty));
    assert_eq!(
        trace::parse("TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:15:47,5,5\n"),
        Err(TraceError::MissingColumn {
            column: "ContextTokens"
        })
    );
    let e = trace::load(std::path::Path::new("/nonexistent/trace.csv")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/trace.csv"), "{e}");
}

#[test]
fn loads_a_file_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.csv");
    std::fs::write(&p, format!("{HEADER}2023-11-16 18:15:46,3,4\n")).unwrap();
    assert_eq!(trace::load(&p).unwrap().requests.len(), 1);
}

#[test]
fn workload_is_seeded_scaled_and_sorted() {
    let t = trace::embedded();
    let s = Scaling {
        time_scale: 10.0,
        prompt_div: 16,
        output_div: 8,
        max_prompt: 64,
        max_output: 32,
    };
    let a = job::workload(&t, 50, &s, 512, 7, 0.0);
    let b = job::workload(&t, 50, &s, 512, 7, 0.0);
    let c = job::workload(&t, 50, &s, 512, 8, 0.0);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a.requests.len(), 50);
    assert!(a.requests.windows(2).all(|w| w[0].arrival <= w[1].arrival));
    let r0 = a.requests.iter().find(|r| r.id == 0).unwrap();
    assert_eq!(r0.prompt.len(), 374usize.div_ceil(16));
    assert_eq!(r0.output_tokens, 44usize.div_ceil(8));
    assert!(
        a.requests
            .iter()
            .all(|r| r.prompt.len() <= 64 && r.output_tokens <= 32)
    );
    assert!(
        a.requests
            .iter()
            .flat_map(|r| &r.prompt)
            .all(|&t| (3..512).contains(&t))
    );
    // the 50th row arrives about 26 s after the first: /10
    assert!(a.requests.last().unwrap().arrival < Duration::from_secs(4));
    let cancel = job::workload(&t, 200, &s, 512, 7, 0.5);
    let n = cancel
        .requests
        .iter()
        .filter(|r| r.cancel_after.is_some())
        .count();
    assert!((50..150).contains(&n), "{n}");
    assert!(job::workload(&t, 5000, &s, 512, 7, 0.0).requests.len() == 1500);
}

#[test]
fn zone_suffixes_of_the_2024_trace_are_accepted() {
    let t = trace::parse(&format!(
        "{HEADER}2024-05-10 00:00:00.009930+00:00,10,2\n\
         2024-05-10 02:00:01.009930+02:00,20,3\n\
         2024-05-10T00:00:02.5Z,5,1\n"
    ))
    .unwrap();
    let arrivals: Vec<Duration> = t.requests.iter().map(|r| r.arrival).collect();
    assert_eq!(
        arrivals,
        [
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::from_nanos(2_490_070_000)
        ]
    );
    let (line, msg) = row_error(&format!("{HEADER}2024-05-10 00:00:00+0x:00,1,1\n"));
    assert_eq!(line, 2);
    assert!(msg.contains("TIMESTAMP"), "{msg}");
}

#[test]
fn plain_seconds_are_accepted() {
    let t = trace::parse(&format!("{HEADER}100,10,2\n100.25,20,3\n101,5,1\n")).unwrap();
    let arrivals: Vec<Duration> = t.requests.iter().map(|r| r.arrival).collect();
    assert_eq!(
        arrivals,
        [
            Duration::ZERO,
            Duration::from_millis(250),
            Duration::from_secs(1)
        ]
    );
}

#[test]
fn any_out_of_order_row_is_an_error_naming_its_line() {
    // Row 4 is later than the first row but earlier than row 3.
    let (line, msg) = row_error(&format!(
        "{HEADER}2023-11-16 18:15:40,5,5\n2023-11-16 18:15:50,5,5\n2023-11-16 18:15:45,5,5\n"
    ));
    assert_eq!(line, 4);
    assert!(msg.contains("earlier than the previous row"), "{msg}");
    let (line, _) = row_error(&format!("{HEADER}3,1,1\n3,1,1\n2.5,1,1\n"));
    assert_eq!(line, 4);
}

/// Civil timestamps outside the calendar are row errors naming the line:
/// before the fix a year such as 99999999999999999 overflowed the day count
/// (a panic in debug builds, a silently wrong arrival in release) and
/// 2023-02-30 was read as 2023-03-02.
#[test]
fn impossible_dates_are_errors_naming_their_line() {
    let ok = "2023-11-16 18:15:46,5,5\n";
    for bad in [
        "99999999999999999-01-01 00:00:00",
        "9223372036854775807-12-31 23:59:59",
        "10000-01-01 00:00:00",
        "2023-02-29 00:00:00",
        "2023-02-30 00:00:00",
        "2023-04-31 00:00:00",
        "2024-02-30 00:00:00",
    ] {
        let (line, msg) = row_error(&format!("{HEADER}{ok}{bad},5,5\n"));
        assert_eq!(line, 3, "{bad}");
        assert!(
            msg.contains("TIMESTAMP") && msg.contains(bad),
            "{bad}: {msg}"
        );
    }
    // The calendar's real edges still parse.
    for good in [
        "2024-02-29 00:00:00",
        "2023-12-31 23:59:60",
        "9999-12-31 23:59:59",
    ] {
        assert!(trace::parse_timestamp(good).is_ok(), "{good}");
    }
}

/// A byte that is not UTF-8 is a row error naming its line: before the fix
/// the whole file failed with "stream did not contain valid UTF-8" and no
/// line (a Latin-1 byte deep in a long trace could not be found).
#[test]
fn a_non_utf8_byte_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.csv");
    let mut b = format!("{HEADER}0,5,5\n1,5,5\n").into_bytes();
    b.extend(b"2,5\xe9,5\n3,5,5\n");
    std::fs::write(&p, b).unwrap();
    match trace::load(&p).unwrap_err() {
        TraceError::Row { line, msg } => {
            assert_eq!(line, 4);
            assert!(msg.contains("UTF-8"), "{msg}");
        }
        e => panic!("expected a row error, got {e}"),
    }
}
