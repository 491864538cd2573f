use super::*;
use crate::pb::trace_record::Kind;

fn file(records: &[pb::TraceRecord]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    frame(&header(RAW_FORMAT, "m", "master", 1, 1), &mut out);
    for r in records {
        frame(r, &mut out);
    }
    out
}

fn tick(seq: u64) -> pb::TraceRecord {
    pb::TraceRecord {
        seq,
        now_ms: seq * 10,
        kind: Some(Kind::Master(pb::TraceMasterStep {
            input: Some(pb::trace_master_step::Input::Tick(pb::Empty {})),
            ..Default::default()
        })),
    }
}

#[test]
fn a_file_reads_back_as_written() {
    let recs: Vec<_> = (1..=5).map(tick).collect();
    let f = parse("f", &file(&recs)).unwrap();
    assert_eq!(f.records, recs);
    assert_eq!(f.header.node, "m");
    assert_eq!(f.header.protocol, protocol());
    assert!(f.cut.is_none());
}

/// Cut anywhere, a file gives the records before the cut and says where it is; it never
/// gives a record that was not written whole.
#[test]
fn a_file_cut_anywhere_gives_the_records_before_the_cut() {
    let recs: Vec<_> = (1..=4).map(tick).collect();
    let bytes = file(&recs);
    let whole = parse("f", &bytes).unwrap();
    // Where each frame ends.
    let mut ends = vec![MAGIC.len()];
    let mut one = Vec::new();
    frame(&header(RAW_FORMAT, "m", "master", 1, 1), &mut one);
    ends.push(ends[0] + one.len());
    for r in &recs {
        one.clear();
        frame(r, &mut one);
        ends.push(ends.last().unwrap() + one.len());
    }
    for len in 0..bytes.len() {
        match parse("f", &bytes[..len]) {
            Ok(f) => {
                assert!(whole.records.starts_with(&f.records), "cut at {len}");
                let cut = f.cut.as_ref().map(|c| c.offset);
                if ends.contains(&len) {
                    assert_eq!(cut, None, "cut at {len}");
                } else {
                    assert!(
                        cut.is_some_and(|o| o < len as u64 || len < MAGIC.len()),
                        "cut at {len}: {cut:?}"
                    );
                }
            }
            Err(e) => assert!(
                len <= MAGIC.len() || e.what.contains("header"),
                "{len}: {e}"
            ),
        }
    }
}

/// Every flipped bit of a frame is found, with the file and offset named.
#[test]
fn a_damaged_file_is_an_error_naming_file_and_offset() {
    let recs: Vec<_> = (1..=3).map(tick).collect();
    let bytes = file(&recs);
    for bit in MAGIC.len() * 8..bytes.len() * 8 {
        let mut bad = bytes.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        match parse("some/file", &bad) {
            Err(e) => {
                assert_eq!(e.file, "some/file");
                assert!(e.offset < bytes.len() as u64);
            }
            // A flip in a length may make the file look cut short; never a wrong record.
            Ok(f) => {
                assert!(f.cut.is_some(), "bit {bit} passed unnoticed");
                assert!(recs.starts_with(&f.records), "bit {bit}");
            }
        }
    }
    // Zeros where a crash left blocks unwritten end the file; a record without content
    // in the middle is damage.
    let mut zeros = bytes.clone();
    zeros.extend_from_slice(&[0; 100]);
    let f = parse("z", &zeros).unwrap();
    assert_eq!(f.records, recs);
    assert!(f.cut.unwrap().what.contains("zeros"));
    let mut hole = bytes.clone();
    frame(&pb::TraceRecord::default(), &mut hole);
    frame(&tick(4), &mut hole);
    assert!(
        parse("h", &hole)
            .unwrap_err()
            .what
            .contains("no place or no content")
    );
    // A file created and cut before its first bytes: empty, and said so.
    let f = parse("e", b"").unwrap();
    assert!(f.records.is_empty() && f.cut.is_some() && f.header.format == 0);
    let e = parse("x.trace", b"hello, this is not a trace").unwrap_err();
    assert_eq!(
        e.to_string(),
        "x.trace: at byte 0: not a Tessera trace file (no trace magic)"
    );
    let mut other = MAGIC.to_vec();
    frame(
        &pb::TraceHeader {
            format: 99,
            build: "9.9.9".into(),
            ..header(RAW_FORMAT, "m", "master", 1, 1)
        },
        &mut other,
    );
    let e = parse("y", &other).unwrap_err();
    assert!(
        e.what.contains("trace format 99") && e.what.contains("9.9.9"),
        "{e}"
    );
}
