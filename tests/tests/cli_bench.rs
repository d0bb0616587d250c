//! `sluice bench` against a real `sluiced`: every limit kind, human and
//! `--json` output, bounded by request count.

use sluice_tests::support::{binary, Sluiced};

fn bench(server: &Sluiced, args: &[&str]) -> std::process::Output {
    std::process::Command::new(binary("sluice"))
        .args([
            "--addr",
            &server.addr.to_string(),
            "bench",
            "--connections",
            "4",
            "--requests",
            "3000",
        ])
        .args(args)
        .output()
        .expect("sluice runs")
}

#[test]
fn every_kind_reports_one_json_object_with_percentiles() {
    let server = Sluiced::start(&["--shards", "2"]);
    for kind in [
        "token-bucket",
        "fixed-window",
        "sliding-log",
        "sliding-counter",
        "concurrency",
    ] {
        let out = bench(
            &server,
            &[
                "--pipeline",
                "16",
                "--keys",
                "500",
                "--kind",
                kind,
                "--rate",
                "5/s",
                "--json",
            ],
        );
        assert!(
            out.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["kind"], kind);
        assert_eq!(v["requests"], 3000);
        assert_eq!(v["errors"], 0, "{kind}: {text}");
        let (allowed, denied) = (
            v["allowed"].as_u64().unwrap(),
            v["denied"].as_u64().unwrap(),
        );
        assert_eq!(allowed + denied, 3000);
        // 500 keys x 5 units per second is the most any kind admits: once,
        // plus once per second (or part) the run took (a fixed window
        // crossed at its boundary, a bucket refilling).
        let elapsed_s = 3000.0 / v["ops_per_s"].as_f64().unwrap();
        let most = 2500.0 * (1.0 + elapsed_s.ceil());
        assert!(
            allowed as f64 <= most && allowed > 0,
            "{kind}: {allowed} admitted in {elapsed_s:.2} s (at most {most})"
        );
        let lat = &v["latency_us"];
        let (p50, p99, p999, max) = (
            lat["p50"].as_f64().unwrap(),
            lat["p99"].as_f64().unwrap(),
            lat["p999"].as_f64().unwrap(),
            lat["max"].as_f64().unwrap(),
        );
        assert!(
            0.0 < p50 && p50 <= p99 && p99 <= p999 && p999 <= max,
            "{lat}"
        );
        // The mean of 3000 round trips, none longer than max: positive and
        // at most max (a mean from the wrong unit would be 1000 times off).
        let mean = lat["mean"].as_f64().unwrap();
        assert!(0.0 < mean && mean <= max, "{lat}");
        assert!(v["ops_per_s"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn human_output_and_sequential_keys() {
    let server = Sluiced::start(&["--shards", "1"]);
    let out = bench(
        &server,
        &[
            "--keys",
            "3000",
            "--key-order",
            "sequential",
            "--rate",
            "1/h",
            "--burst",
            "1",
        ],
    );
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("ops/s") && text.contains("p99.9"), "{text}");
    // Every key exactly once, each with a burst of 1: all admitted.
    assert!(
        text.contains("(allowed 3000, denied 0, errors 0)"),
        "{text}"
    );
    let out = bench(
        &server,
        &["--kind", "fixed-window", "--target", "redis-lua"],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "redis-lua runs the token-bucket script only"
    );
}

#[test]
fn the_loopback_floor_answers_the_bench_with_real_decisions() {
    // benches/compare.sh measures Sluice against `sluice-floor`; its rows
    // are only worth something if the floor decides for real. Burst 1,
    // no refill within the run: each of the 500 keys admits once at most
    // (keys that share one of its buckets, fewer), never 3000 times. The
    // same with a large array (`--buckets`, the 10M-key floor's path: a
    // frame's buckets prefetched, then decided).
    for extra in [&[][..], &["--buckets", "1048576"][..]] {
        let mut floor = std::process::Command::new(binary("sluice-floor"))
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sluice-floor starts");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(floor.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let addr = line
            .trim()
            .strip_prefix("sluice-floor listening on ")
            .unwrap_or_else(|| panic!("first line: {line:?}"))
            .to_owned();
        let out = std::process::Command::new(binary("sluice"))
            .args([
                "--addr",
                &addr,
                "bench",
                "--connections",
                "4",
                "--pipeline",
                "16",
            ])
            .args([
                "--requests",
                "3000",
                "--keys",
                "500",
                "--rate",
                "1/h",
                "--burst",
                "1",
                "--json",
            ])
            .output()
            .expect("sluice runs");
        let _ = floor.kill();
        let _ = floor.wait();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["errors"], 0, "{extra:?}: {v}");
        let (allowed, denied) = (
            v["allowed"].as_u64().unwrap(),
            v["denied"].as_u64().unwrap(),
        );
        assert_eq!(allowed + denied, 3000, "{extra:?}: {v}");
        assert!(
            (1..=500).contains(&allowed),
            "{extra:?}: {allowed} admitted: {v}"
        );
    }
    // A size that is not a power of two is refused at start, by name.
    let out = std::process::Command::new(binary("sluice-floor"))
        .args(["--buckets", "1000"])
        .output()
        .expect("sluice-floor runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--buckets 1000"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_resp_floor_answers_cl_throttle_with_real_decisions() {
    // compare.sh's RESP floor row is only worth something if the floor
    // decides: one unit (max_burst 0), none back within the hour, so the
    // second CL.THROTTLE of a key is limited; PING and CONFIG GET (what
    // redis-benchmark asks first) are answered.
    use std::io::{BufRead, Read, Write};
    let mut floor = std::process::Command::new(binary("sluice-floor"))
        .args(["--resp-port", "0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sluice-floor starts");
    let mut out = std::io::BufReader::new(floor.stdout.take().unwrap());
    let (mut first, mut second) = (String::new(), String::new());
    out.read_line(&mut first).unwrap();
    out.read_line(&mut second).unwrap();
    let addr = second
        .trim()
        .strip_prefix("sluice-floor resp listening on ")
        .unwrap_or_else(|| panic!("second line: {second:?}"))
        .to_owned();
    let mut stream = std::net::TcpStream::connect(&addr).expect("connects");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let throttle =
        b"*6\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n$1\r\n0\r\n$1\r\n1\r\n$4\r\n3600\r\n$1\r\n1\r\n";
    let mut request = Vec::new();
    request.extend_from_slice(b"*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$4\r\nsave\r\n");
    request.extend_from_slice(throttle);
    request.extend_from_slice(throttle);
    request.extend_from_slice(b"PING\r\n");
    stream.write_all(&request).unwrap();
    let expected: &[u8] =
        b"*0\r\n*5\r\n:0\r\n:1\r\n:0\r\n:-1\r\n:3600\r\n*5\r\n:1\r\n:1\r\n:0\r\n:3600\r\n:3600\r\n+PONG\r\n";
    let mut got = vec![0u8; expected.len()];
    let read = stream.read_exact(&mut got);
    let _ = floor.kill();
    let _ = floor.wait();
    read.expect("every reply");
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(expected)
    );
}

/// `--priority-mix` and `--reserve` on one key with 2 shards (so one shard
/// owns no key): 3,000 requests of all three classes against 10 units,
/// half kept for critical. Every class is counted; exactly 10 are admitted,
/// low and normal together at most the 5 unreserved, critical the rest;
/// the timeline adds up to the admissions. Without a mix, the JSON has no
/// `classes`.
#[test]
fn a_class_mix_counts_each_class_and_the_reserves_hold() {
    let server = Sluiced::start(&["--shards", "2"]);
    let args = [
        "--pipeline",
        "16",
        "--keys",
        "1",
        "--rate",
        "10/h",
        "--burst",
        "10",
        "--json",
    ];
    let mut mixed = args.to_vec();
    mixed.extend(["--priority-mix", "1,1,1", "--reserve", "critical:90%"]);
    let out = bench(&server, &mixed);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["requests"].as_u64(), v["allowed"].as_u64()),
        (Some(3000), Some(10)),
        "{v}"
    );
    let by_class = v["classes"]["by_class"].as_array().unwrap();
    let field = |i: usize, f: &str| by_class[i][f].as_u64().unwrap();
    let names: Vec<&str> = by_class
        .iter()
        .map(|c| c["class"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["low", "normal", "critical"]);
    assert_eq!((0..3).map(|i| field(i, "sent")).sum::<u64>(), 3000);
    assert!((0..3).all(|i| field(i, "sent") > 800), "{v}");
    assert!(field(0, "admitted") + field(1, "admitted") <= 1, "{v}");
    assert!(field(2, "admitted") >= 9, "{v}");
    let timeline = v["classes"]["timeline"].as_array().unwrap();
    for (i, class) in names.iter().enumerate() {
        let summed: u64 = timeline.iter().map(|step| step[i].as_u64().unwrap()).sum();
        assert_eq!(summed, field(i, "admitted"), "{class}: {v}");
    }
    let plain = bench(&server, &args);
    let v: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert!(v.get("classes").is_none(), "{v}");
    // Bad flags are usage errors that say why.
    let out = bench(&server, &["--priority-mix", "1,1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("LOW,NORMAL,CRITICAL"));
    let out = bench(&server, &["--reserve", "low:10%"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("keeps nothing"));
}
