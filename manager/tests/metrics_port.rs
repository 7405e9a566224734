//! The metrics port through a real `Exporter` on 127.0.0.1:0: a request head is read up to a
//! small cap and a deadline, so a client that never ends its request line is cut off without
//! growing the process; a slow scraper never delays another scrape; scrapers beyond the cap
//! are answered at once without blocking accepts, and dropping the exporter returns promptly;
//! the text parses back to every series the hand-written exposition had.

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orbitkv_manager::metrics::{
    Exporter, Gauges, LATENCY_BUCKETS_US, LATENCY_KINDS, Metrics, Timed, inc,
};
use orbitkv_store::Usage;
use orbitkv_store::stats::StatsSnapshot;

/// Every series name without labels that the hand-written exposition had.
const OLD_NAMES: [&str; 36] = [
    "orbitkv_connections_total",
    "orbitkv_refused_peers_total",
    "orbitkv_malformed_messages_total",
    "orbitkv_seals_total",
    "orbitkv_seal_refusals_total",
    "orbitkv_refused_tokens_total",
    "orbitkv_sessions",
    "orbitkv_queries_total",
    "orbitkv_hits_total",
    "orbitkv_proven_tokens_total",
    "orbitkv_loaded_pages_total",
    "orbitkv_published_pages_total",
    "orbitkv_failed_pages_total",
    "orbitkv_loaded_bytes_total",
    "orbitkv_published_bytes_total",
    "orbitkv_store_puts_total",
    "orbitkv_store_put_bytes_total",
    "orbitkv_store_gets_total",
    "orbitkv_store_dram_hits_total",
    "orbitkv_store_repaired_tails_total",
    "orbitkv_store_checksum_failures_total",
    "orbitkv_store_refused_puts_total",
    "orbitkv_store_lost_records_total",
    "orbitkv_store_failed_deletes_total",
    "orbitkv_store_failed_dir_syncs_total",
    "orbitkv_store_failed_stats_total",
    "orbitkv_store_quarantined_segments",
    "orbitkv_leases",
    "orbitkv_store_pins",
    "orbitkv_store_records",
    "orbitkv_store_ssd_bytes",
    "orbitkv_store_ssd_budget_bytes",
    "orbitkv_store_dram_bytes",
    "orbitkv_request_seconds_sum",
    "orbitkv_request_seconds_count",
    "orbitkv_request_seconds_bucket",
];

/// The `reason` label values of `orbitkv_misses_total`, as the old exposition wrote them.
const OLD_MISS_REASONS: [&str; 10] = [
    "nothing_beyond_origin",
    "unsupported_component",
    "gap",
    "overlap",
    "duplicate",
    "past_end",
    "missing_rank",
    "window_incomplete",
    "no_checkpoint",
    "no_common_boundary",
];

/// The `reason` label values of `orbitkv_validator_rejections_total`.
const OLD_REJECTION_REASONS: [&str; 10] = [
    "namespace",
    "domain",
    "unknown_group",
    "component",
    "rank",
    "key_fields",
    "format",
    "misaligned",
    "overlap",
    "duplicate",
];

/// The `kind` label values of `orbitkv_request_seconds`.
const OLD_KINDS: [&str; 6] = [
    "query",
    "acquire",
    "load",
    "publish_copied",
    "publish_durable",
    "release",
];

/// The `le` label values of `orbitkv_request_seconds_bucket`, as the old exposition wrote them.
const OLD_LE: [&str; 15] = [
    "0.00001", "0.000025", "0.00005", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005",
    "0.01", "0.025", "0.05", "0.1", "1", "+Inf",
];

/// The series keys (`name{labels}`, `le` made canonical) the old exposition had.
fn old_series() -> BTreeSet<String> {
    let mut s: BTreeSet<String> = OLD_NAMES
        .iter()
        .filter(|n| !n.starts_with("orbitkv_request_seconds"))
        .map(|n| (*n).to_owned())
        .collect();
    for r in OLD_MISS_REASONS {
        s.insert(format!("orbitkv_misses_total{{reason=\"{r}\"}}"));
    }
    for r in OLD_REJECTION_REASONS {
        s.insert(format!(
            "orbitkv_validator_rejections_total{{reason=\"{r}\"}}"
        ));
    }
    for k in OLD_KINDS {
        for le in OLD_LE {
            s.insert(canonical(&format!(
                "orbitkv_request_seconds_bucket{{kind=\"{k}\",le=\"{le}\"}}"
            )));
        }
        s.insert(format!("orbitkv_request_seconds_sum{{kind=\"{k}\"}}"));
        s.insert(format!("orbitkv_request_seconds_count{{kind=\"{k}\"}}"));
    }
    s
}

/// A series key with its `le` value written as Rust writes the number it parses to.
fn canonical(key: &str) -> String {
    let Some((head, rest)) = key.split_once("le=\"") else {
        return key.to_owned();
    };
    let (value, tail) = rest
        .split_once('"')
        .unwrap_or_else(|| panic!("unterminated le in {key}"));
    let v = match value {
        "+Inf" => "+Inf".to_owned(),
        v => v
            .parse::<f64>()
            .unwrap_or_else(|e| panic!("le {v}: {e}"))
            .to_string(),
    };
    format!("{head}le=\"{v}\"{tail}")
}

/// The sample lines of an exposition as (canonical series key, value), each checked to parse.
fn samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (key, value) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("no value: {l:?}"));
            let name = key.split('{').next().unwrap_or(key);
            assert!(
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':'),
                "bad name: {l:?}"
            );
            if let Some(labels) = key.strip_prefix(name) {
                assert!(
                    labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                    "bad labels: {l:?}"
                );
            }
            let v = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap_or_else(|e| panic!("value of {l:?}: {e}")),
            };
            (canonical(key), v)
        })
        .collect()
}

fn usage() -> Usage {
    Usage {
        ssd_used: 4096,
        ssd_budget: Some(1 << 20),
        probation_segments: 0,
        dram_used: 512,
        dram_budget: 1 << 20,
        dram_entries: 1,
        pins: 3,
        records: 9,
        waiting_records: 0,
        waiting_bytes: 0,
        writes_refused: false,
    }
}

fn exporter(metrics: Arc<Metrics>) -> Exporter {
    let store = StatsSnapshot {
        dram_hits: 7,
        gets: 11,
        ..StatsSnapshot::default()
    };
    let source = move || {
        let now = Gauges {
            sessions: 1,
            leases: 2,
            usage: usage(),
        };
        metrics.render(&now, &store)
    };
    Exporter::start("127.0.0.1:0", source).unwrap_or_else(|e| panic!("{e}"))
}

/// One HTTP answer: the status code, the head and the body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// Sends `request` and reads the answer to the end, giving up after `timeout`.
fn ask(addr: SocketAddr, request: &[u8], timeout: Duration) -> std::io::Result<Answer> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(request)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no head in {text:?}")))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))?;
    Ok(Answer {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    })
}

/// A scrape as Prometheus sends it.
fn scrape(addr: SocketAddr, timeout: Duration) -> std::io::Result<Answer> {
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: Prometheus/3.0\r\nAccept: text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"
    );
    ask(addr, request.as_bytes(), timeout)
}

/// The process's peak resident memory, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_else(|e| panic!("{e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"))
}

/// Whether the exporter answered or closed `s` (as opposed to still holding it) within `wait`.
fn answered_or_closed(mut s: &TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut buf = [0u8; 256];
    match s.read(&mut buf) {
        // Closed, or an HTTP answer (503 beyond the cap).
        Ok(n) => n == 0 || buf.get(..n).is_some_and(|b| b.starts_with(b"HTTP/1.1 ")),
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

#[test]
fn endless_request_line_is_cut_off_without_growing_the_process() {
    let e = exporter(Arc::new(Metrics::default()));
    let before = peak_rss_kib();
    let mut s = TcpStream::connect(e.addr()).unwrap();
    // A stalled exporter makes the write time out, which the test tells apart from a cut-off.
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let chunk = vec![b'a'; 64 << 10];
    let total = 64usize << 20;
    let mut sent = 0;
    let mut cut = None;
    while sent < total {
        match s.write(&chunk) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                cut = Some(e);
                break;
            }
        }
    }
    let grown = peak_rss_kib().saturating_sub(before);
    assert!(
        sent < total,
        "the exporter took all {sent} bytes of a request line without a newline"
    );
    let cut = cut.unwrap();
    assert!(
        matches!(
            cut.kind(),
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
        ),
        "not cut off: {cut} after {sent} bytes"
    );
    assert!(grown < 8 << 10, "the process grew by {grown} KiB");
    // The exporter keeps serving.
    let a = scrape(e.addr(), Duration::from_secs(3)).unwrap();
    assert_eq!(a.status, 200, "{}", a.head);
}

#[test]
fn a_head_at_the_cap_without_its_end_gets_431() {
    let e = exporter(Arc::new(Metrics::default()));
    let mut request = b"GET /metrics HTTP/1.1\r\nX-Filler: ".to_vec();
    request.resize(8 << 10, b'a');
    let a = ask(e.addr(), &request, Duration::from_secs(3)).unwrap();
    assert_eq!(a.status, 431, "{}", a.head);
    let a = scrape(e.addr(), Duration::from_secs(3)).unwrap();
    assert_eq!(a.status, 200, "{}", a.head);
}

#[test]
fn a_silent_scraper_does_not_delay_another() {
    let e = exporter(Arc::new(Metrics::default()));
    // One connects and sends nothing; one stops in the middle of its request line.
    let _silent = TcpStream::connect(e.addr()).unwrap();
    let mut partial = TcpStream::connect(e.addr()).unwrap();
    partial.write_all(b"GET /met").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let a = scrape(e.addr(), Duration::from_secs(3)).unwrap();
    let took = started.elapsed();
    assert_eq!(a.status, 200, "{}", a.head);
    assert!(took < Duration::from_secs(1), "the scrape took {took:?}");
    assert!(a.body.contains("orbitkv_queries_total 0\n"), "{}", a.body);
}

#[test]
fn scrapers_beyond_the_cap_do_not_block_accepts_and_drop_is_prompt() {
    let e = exporter(Arc::new(Metrics::default()));
    let addr = e.addr();
    let slow: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // A scrape beyond the cap is answered at once (refused while the slow ones hold every slot).
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let a = scrape(addr, Duration::from_secs(3)).unwrap();
    let took = started.elapsed();
    assert!(a.status == 503 || a.status == 200, "{}", a.head);
    assert!(took < Duration::from_secs(1), "the scrape took {took:?}");
    // Those beyond the cap were answered or closed, not queued behind the slow ones.
    let answered = slow
        .iter()
        .filter(|s| answered_or_closed(s, Duration::from_millis(50)))
        .count();
    assert!(
        answered >= 20,
        "only {answered} of 40 silent connections were answered"
    );
    let started = Instant::now();
    drop(e);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "dropping the exporter took {took:?}"
    );
    // Dropping closed the connections the exporter still held.
    for s in &slow {
        assert!(answered_or_closed(s, Duration::from_secs(1)));
    }
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
}

#[test]
fn the_text_parses_back_to_the_old_series() {
    let m = Arc::new(Metrics::default());
    for _ in 0..3 {
        inc(&m.queries);
    }
    inc(&m.hits);
    m.miss(3);
    inc(&m.rejections[6]);
    m.observe(Timed::Load, Duration::from_micros(200));
    m.observe(Timed::Load, Duration::from_secs(2));
    let e = exporter(m);
    let a = scrape(e.addr(), Duration::from_secs(3)).unwrap();
    assert_eq!(a.status, 200, "{}", a.head);
    let head = a.head.to_ascii_lowercase();
    assert!(
        head.contains("\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8"),
        "{}",
        a.head
    );
    assert!(
        head.contains(&format!("\r\ncontent-length: {}", a.body.len())),
        "{}",
        a.head
    );
    let samples = samples(&a.body);
    let have: BTreeSet<&str> = samples.iter().map(|(k, _)| k.as_str()).collect();
    for key in old_series() {
        assert!(have.contains(key.as_str()), "{key} is gone:\n{}", a.body);
    }
    // Every series belongs to a family with a TYPE line.
    for (key, _) in &samples {
        let name = key.split('{').next().unwrap_or(key);
        let typed = a.body.lines().any(|l| {
            l.strip_prefix("# TYPE ")
                .and_then(|t| t.split(' ').next())
                .is_some_and(|family| name.starts_with(family))
        });
        assert!(typed, "{key} has no TYPE line:\n{}", a.body);
    }
    let value = |key: &str| {
        samples
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no {key}:\n{}", a.body))
    };
    for line in [
        "orbitkv_queries_total 3\n",
        "orbitkv_hits_total 1\n",
        "orbitkv_leases 2\n",
        "orbitkv_sessions 1\n",
        "orbitkv_store_pins 3\n",
        "orbitkv_store_dram_hits_total 7\n",
        "orbitkv_store_gets_total 11\n",
        "orbitkv_misses_total{reason=\"gap\"} 1\n",
        "orbitkv_validator_rejections_total{reason=\"format\"} 1\n",
        "orbitkv_request_seconds_count{kind=\"load\"} 2\n",
    ] {
        assert!(a.body.contains(line), "no {line:?} in:\n{}", a.body);
    }
    // The histogram's buckets are cumulative and in seconds; the 2 s request is only in +Inf.
    let bucket = |le: &str| {
        value(&canonical(&format!(
            "orbitkv_request_seconds_bucket{{kind=\"load\",le=\"{le}\"}}"
        )))
    };
    assert_eq!(bucket("0.0001"), 0.0);
    assert_eq!(bucket("0.00025"), 1.0);
    assert_eq!(bucket("1"), 1.0);
    assert_eq!(bucket("+Inf"), 2.0);
    let sum = value("orbitkv_request_seconds_sum{kind=\"load\"}");
    assert!((sum - 2.0002).abs() < 1e-9, "{sum}");
    assert_eq!(LATENCY_BUCKETS_US.len() + 1, OLD_LE.len());
    assert_eq!(LATENCY_KINDS, OLD_KINDS);
}

#[test]
fn other_paths_and_methods_are_refused() {
    let e = exporter(Arc::new(Metrics::default()));
    let t = Duration::from_secs(3);
    let a = ask(e.addr(), b"GET / HTTP/1.1\r\n\r\n", t).unwrap();
    assert_eq!(a.status, 404, "{}", a.head);
    let a = ask(e.addr(), b"POST /metrics HTTP/1.1\r\n\r\n", t).unwrap();
    assert_ne!(a.status, 200, "{}", a.head);
    let a = ask(e.addr(), b"GET /metrics HTTP/1.0\n\n", t).unwrap();
    assert_eq!(a.status, 200, "{}", a.head);
}
