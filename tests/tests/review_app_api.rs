//! Review from an application developer's side: each test here fails on the
//! code as reviewed, because of the finding named in its doc comment.

mod common;

use common::setup;
use upnvme::{CopyRange, IoCommand, IoData, QueuePairOptions, Reject};
use upnvme_tests::{ModelConfig, NamespaceConfig};

/// Copy takes at most 128 source ranges (`MAX_COPY_RANGES`, one list page),
/// but a Copy of 129..=256 ranges is refused with the Dataset Management
/// message "Dataset Management with 200 ranges: must be 1..=256": it names
/// the wrong command and a limit the count already satisfies, so it does not
/// say what is wrong. (`IoCommand::Copy`'s rustdoc also promises 1..=256.)
#[test]
fn a_copy_with_too_many_ranges_is_refused_with_a_copy_message() {
    let (_m, c) = setup(ModelConfig {
        oncs: ModelConfig::ONCS_COPY | ModelConfig::ONCS_DSM,
        ..common::config_one_ns(512, 100_000)
    });
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ranges: Vec<CopyRange> = (0..200)
        .map(|i| CopyRange {
            slba: i * 2,
            blocks: 1,
        })
        .collect();
    let copy = IoCommand::Copy {
        ns: &ns,
        sdlba: 10_000,
        ranges: &ranges,
    };
    let r = qp.submit_io(copy, IoData::none(), 1).unwrap_err();
    let msg = qp.describe(r.reason).to_string();
    assert!(
        msg.contains("Copy") && msg.contains("128"),
        "a Copy of 200 source ranges was refused with: {msg}"
    );
}

/// A Read or Write above 65536 blocks is refused for its block count first,
/// before its buffer is measured, and then split; a buffer too small for the
/// whole is then refused by the first child that does not fit, with that
/// child's need: a 32 MiB buffer for a 35.8 MB read comes back as
/// "the transfer needs 524288 bytes; the buffer is smaller" — false for the
/// buffer passed, and no hint of the size actually needed. (For a vector the
/// split measures the whole first; for a buffer or a slice it does not.)
#[test]
fn a_split_refusal_for_a_small_buffer_names_the_whole_transfers_need() {
    let (_m, c) = setup(common::config_one_ns(512, 100_000));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let blocks = 70_000u32;
    let buf = c.alloc_dma(32 << 20).unwrap();
    let read = IoCommand::Read {
        ns: &ns,
        slba: 0,
        blocks,
    };
    let r = qp.submit(read, Some(buf), 1).unwrap_err();
    let len = r.buffer.as_ref().unwrap().len() as u64;
    let msg = qp.describe(r.reason).to_string();
    assert_eq!(
        r.reason,
        Reject::BufferTooSmall {
            need: u64::from(blocks) * 512
        },
        "buffer of {len} bytes refused with: {msg}"
    );
}

/// The same for a separate metadata buffer: a 300000-byte metadata buffer
/// for 70000 blocks with 8 bytes each (560000 needed) is refused with
/// "pass one of at least 8192 bytes" (one child's share), which the buffer
/// passed already exceeds.
#[test]
fn a_split_refusal_for_a_small_metadata_buffer_names_the_whole_need() {
    let (_m, c) = setup(ModelConfig {
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: 512,
            blocks: 100_000,
            ms: 8,
            extended: false,
            ..NamespaceConfig::default()
        }],
        ..ModelConfig::default()
    });
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let blocks = 70_000u32;
    let data = c.alloc_dma(blocks as usize * 512).unwrap();
    let md = c.alloc_dma(300_000).unwrap();
    let read = IoCommand::Read {
        ns: &ns,
        slba: 0,
        blocks,
    };
    let r = qp
        .submit_io(read, IoData::buffer(data).metadata(md), 1)
        .unwrap_err();
    let md_len = r.metadata.as_ref().unwrap().len() as u64;
    let msg = qp.describe(r.reason).to_string();
    assert_eq!(
        r.reason,
        Reject::MetadataBuffer {
            need: u64::from(blocks) * 8
        },
        "metadata buffer of {md_len} bytes refused with: {msg}"
    );
}
