//! vLLM's KV-event messages, decoded from arbitrary bytes.
//!
//! A message is ZMQ multipart `[topic, seq, payload]`: `seq` is an 8-byte big-endian sequence
//! number per publisher, `payload` is msgspec's msgpack of a `KVEventBatch`. msgspec writes a
//! struct either as a map (field name → value) or, for `array_like` structs, as an array in field
//! order; tagged unions (the events) carry their class name as `type` (maps) or as the first
//! element (arrays). Both shapes are read, so the decoder follows vLLM versions that switch.
//!
//! Strict about what it understands, tolerant of the rest: an event type or a field it does not
//! know is kept as [`Event::Unknown`] or counted in [`Batch::unknown_fields`]; a known event whose
//! known field has the wrong shape is a [`DecodeError`] (the batch is then treated as lost, like a
//! gap). No input panics: the payload is read as a bounded msgpack tree first (rmpv, depth
//! capped, no preallocation from declared lengths).

use rmpv::Value;

/// How deep the msgpack tree may nest (a batch nests 4-5 levels; `extra_keys` a few more).
const MAX_DEPTH: usize = 64;

/// An engine block hash as vLLM sends it: an integer (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`,
/// the default: the digest's last 8 bytes, big-endian) or the raw digest bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BlockHash {
    /// The integer form (negative integers from old vLLM versions are kept as their two's
    /// complement bits).
    Int(u64),
    /// The raw digest (32 bytes for the sha256 algorithms).
    Bytes(Vec<u8>),
}

impl BlockHash {
    /// The 64-bit form the index keys on: the integer itself, or the last 8 bytes of the digest
    /// big-endian (what vLLM would have sent as an integer), zero-padded on the left when shorter.
    pub fn as_u64(&self) -> u64 {
        match self {
            BlockHash::Int(v) => *v,
            BlockHash::Bytes(b) => {
                let tail = &b[b.len().saturating_sub(8)..];
                tail.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
            }
        }
    }
}

/// `BlockStored`: full blocks the engine has just cached, in order, each the child of the one
/// before (the first the child of `parent_block_hash`, or a root when `None`).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockStored {
    /// One hash per block.
    pub block_hashes: Vec<BlockHash>,
    /// The hash of the block before the first, `None` for a prompt's first block.
    pub parent_block_hash: Option<BlockHash>,
    /// The blocks' token ids, `block_size` per block.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// The LoRA adapter's name, when the blocks belong to one.
    pub lora_name: Option<String>,
    /// Where the blocks live (`"GPU"`, `"CPU"` for offloaded copies, or absent).
    pub medium: Option<String>,
    /// True when some block's `extra_keys` entry is not null (multimodal inputs, a cache salt,
    /// LoRA): its hash then depends on more than the token ids.
    pub has_extra_keys: bool,
    /// The KV-cache group (hybrid models have several); `None` from versions without groups.
    pub group_idx: Option<u32>,
}

/// `BlockRemoved`: blocks the engine evicted (only their hashes).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockRemoved {
    /// The evicted blocks' hashes.
    pub block_hashes: Vec<BlockHash>,
    /// Where they were evicted from.
    pub medium: Option<String>,
    /// The KV-cache group.
    pub group_idx: Option<u32>,
}

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Blocks cached.
    BlockStored(BlockStored),
    /// Blocks evicted.
    BlockRemoved(BlockRemoved),
    /// The whole prefix cache dropped (`POST /reset_prefix_cache`, a weight update).
    AllBlocksCleared,
    /// An event type this decoder does not know (its tag, or `"?"` when it has none).
    Unknown(String),
}

/// One `KVEventBatch`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Batch {
    /// The engine's wall-clock time of the batch (seconds since the epoch).
    pub ts: f64,
    /// The events, in the engine's order.
    pub events: Vec<Event>,
    /// The data-parallel rank that published it.
    pub data_parallel_rank: Option<i64>,
    /// Fields this decoder does not know, over the batch and its events (tolerated, counted).
    pub unknown_fields: u32,
}

impl Batch {
    /// How many events have a type this decoder does not know.
    pub fn unknown_events(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::Unknown(_)))
            .count()
    }
}

/// One multipart message: the publisher's topic, its sequence number, and the batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The ZMQ topic (vLLM's `topic` setting; the endpoint id when the producer binds).
    pub topic: Vec<u8>,
    /// The publisher's sequence number.
    pub seq: u64,
    /// The decoded batch.
    pub batch: Batch,
}

/// Why bytes are not a KV-event batch.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// Not msgpack, truncated, or nested too deep.
    #[error("not a msgpack value: {0}")]
    Msgpack(String),
    /// Bytes left over after the batch.
    #[error("{0} bytes after the batch")]
    TrailingBytes(usize),
    /// A multipart message without exactly three frames.
    #[error("expected 3 frames [topic, seq, payload], got {0}")]
    Frames(usize),
    /// A sequence frame that is not 8 bytes.
    #[error("sequence frame of {0} bytes, expected 8")]
    SeqFrame(usize),
    /// msgpack of the wrong shape (`what` says where).
    #[error("unexpected shape: {0}")]
    Shape(String),
}

impl DecodeError {
    /// A short stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            DecodeError::Msgpack(_) => "msgpack",
            DecodeError::TrailingBytes(_) => "trailing_bytes",
            DecodeError::Frames(_) => "frames",
            DecodeError::SeqFrame(_) => "seq_frame",
            DecodeError::Shape(_) => "shape",
        }
    }
}

fn shape(what: impl Into<String>) -> DecodeError {
    DecodeError::Shape(what.into())
}

/// Decodes one msgpack `KVEventBatch` payload.
pub fn decode(payload: &[u8]) -> Result<Batch, DecodeError> {
    let mut rd = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    if !rd.is_empty() {
        return Err(DecodeError::TrailingBytes(rd.len()));
    }
    batch_from_value(value)
}

/// Decodes the 8-byte big-endian sequence frame.
pub fn decode_seq(frame: &[u8]) -> Result<u64, DecodeError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| DecodeError::SeqFrame(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Decodes a whole multipart message `[topic, seq, payload]`.
pub fn decode_message<F: AsRef<[u8]>>(frames: &[F]) -> Result<Message, DecodeError> {
    let [topic, seq, payload] = frames else {
        return Err(DecodeError::Frames(frames.len()));
    };
    Ok(Message {
        topic: topic.as_ref().to_vec(),
        seq: decode_seq(seq.as_ref())?,
        batch: decode(payload.as_ref())?,
    })
}

/// A struct's fields, whichever way msgspec wrote it.
enum Fields {
    /// `(name, value)` pairs; names that are not strings are dropped and counted.
    Map(Vec<(String, Value)>),
    /// Values in declaration order (after the tag, for tagged arrays).
    Array(Vec<Value>),
}

impl Fields {
    /// Takes the field `name` (map) or position `index` (array), `Nil` when absent.
    fn take(&mut self, name: &str, index: usize) -> Value {
        match self {
            Fields::Map(pairs) => match pairs.iter().position(|(k, _)| k == name) {
                Some(i) => pairs.swap_remove(i).1,
                None => Value::Nil,
            },
            Fields::Array(values) => values
                .get_mut(index)
                .map(|v| std::mem::replace(v, Value::Nil))
                .unwrap_or(Value::Nil),
        }
    }

    /// How many fields were not taken (unknown to us; array positions past `known`).
    fn leftover(&self, known: usize) -> u32 {
        let n = match self {
            Fields::Map(pairs) => pairs.len(),
            Fields::Array(values) => values.len().saturating_sub(known),
        };
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

fn map_fields(pairs: Vec<(Value, Value)>, unknown: &mut u32) -> Vec<(String, Value)> {
    let mut out = Vec::with_capacity(pairs.len());
    for (k, v) in pairs {
        match k {
            Value::String(s) => match s.into_str() {
                Some(s) => out.push((s, v)),
                None => *unknown += 1,
            },
            _ => *unknown += 1,
        }
    }
    out
}

fn batch_from_value(value: Value) -> Result<Batch, DecodeError> {
    let mut unknown = 0u32;
    let mut fields = match value {
        Value::Map(pairs) => Fields::Map(map_fields(pairs, &mut unknown)),
        Value::Array(values) => Fields::Array(values),
        other => return Err(shape(format!("batch is {}", kind(&other)))),
    };
    let ts = match fields.take("ts", 0) {
        Value::F64(f) => f,
        Value::F32(f) => f64::from(f),
        Value::Integer(i) => i.as_f64().unwrap_or(0.0),
        other => return Err(shape(format!("batch ts is {}", kind(&other)))),
    };
    let events = match fields.take("events", 1) {
        Value::Array(events) => events,
        other => return Err(shape(format!("batch events is {}", kind(&other)))),
    };
    let data_parallel_rank = match fields.take("data_parallel_rank", 2) {
        Value::Nil => None,
        Value::Integer(i) => i.as_i64(),
        other => return Err(shape(format!("data_parallel_rank is {}", kind(&other)))),
    };
    unknown = unknown.saturating_add(fields.leftover(3));
    let mut batch = Batch {
        ts,
        events: Vec::with_capacity(events.len()),
        data_parallel_rank,
        unknown_fields: 0,
    };
    for (i, event) in events.into_iter().enumerate() {
        let event = event_from_value(event, &mut unknown).map_err(|e| match e {
            DecodeError::Shape(s) => shape(format!("event {i}: {s}")),
            other => other,
        })?;
        batch.events.push(event);
    }
    batch.unknown_fields = unknown;
    Ok(batch)
}

fn event_from_value(value: Value, unknown: &mut u32) -> Result<Event, DecodeError> {
    let (tag, mut fields) = match value {
        Value::Map(pairs) => {
            let mut pairs = map_fields(pairs, unknown);
            let tag = match pairs.iter().position(|(k, _)| k == "type") {
                Some(i) => match pairs.swap_remove(i).1 {
                    Value::String(s) => s.into_str().unwrap_or_default(),
                    _ => String::new(),
                },
                None => String::new(),
            };
            (tag, Fields::Map(pairs))
        }
        Value::Array(mut values) => {
            if values.is_empty() {
                return Ok(Event::Unknown("?".into()));
            }
            let tag = match values.remove(0) {
                Value::String(s) => s.into_str().unwrap_or_default(),
                _ => String::new(),
            };
            (tag, Fields::Array(values))
        }
        _ => return Ok(Event::Unknown("?".into())),
    };
    match tag.as_str() {
        "BlockStored" => {
            let block_hashes = hashes(fields.take("block_hashes", 0), "block_hashes")?;
            let parent_block_hash = match fields.take("parent_block_hash", 1) {
                Value::Nil => None,
                v => Some(hash(v, "parent_block_hash")?),
            };
            let token_ids = match fields.take("token_ids", 2) {
                Value::Array(ids) => ids
                    .into_iter()
                    .map(|v| {
                        v.as_u64()
                            .and_then(|x| u32::try_from(x).ok())
                            .ok_or_else(|| shape("token id not a u32"))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                other => return Err(shape(format!("token_ids is {}", kind(&other)))),
            };
            let block_size = fields
                .take("block_size", 3)
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .filter(|&x| x > 0)
                .ok_or_else(|| shape("block_size not a positive u32"))?;
            let _lora_id = fields.take("lora_id", 4);
            let medium = opt_str(fields.take("medium", 5), "medium")?;
            let lora_name = opt_str(fields.take("lora_name", 6), "lora_name")?;
            let has_extra_keys = match fields.take("extra_keys", 7) {
                Value::Nil => false,
                Value::Array(keys) => keys.iter().any(|k| !k.is_nil()),
                other => return Err(shape(format!("extra_keys is {}", kind(&other)))),
            };
            let group_idx = opt_u32(fields.take("group_idx", 8), "group_idx")?;
            let _kind = fields.take("kv_cache_spec_kind", 9);
            let _window = fields.take("kv_cache_spec_sliding_window", 10);
            *unknown = unknown.saturating_add(fields.leftover(11));
            Ok(Event::BlockStored(BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                medium,
                has_extra_keys,
                group_idx,
            }))
        }
        "BlockRemoved" => {
            let block_hashes = hashes(fields.take("block_hashes", 0), "block_hashes")?;
            let medium = opt_str(fields.take("medium", 1), "medium")?;
            let group_idx = opt_u32(fields.take("group_idx", 2), "group_idx")?;
            *unknown = unknown.saturating_add(fields.leftover(3));
            Ok(Event::BlockRemoved(BlockRemoved {
                block_hashes,
                medium,
                group_idx,
            }))
        }
        "AllBlocksCleared" => {
            *unknown = unknown.saturating_add(fields.leftover(0));
            Ok(Event::AllBlocksCleared)
        }
        "" => Ok(Event::Unknown("?".into())),
        _ => Ok(Event::Unknown(tag)),
    }
}

fn hash(value: Value, what: &str) -> Result<BlockHash, DecodeError> {
    match value {
        Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => Ok(BlockHash::Int(u)),
            // Two's complement bits of a negative hash (old vLLM's Python `hash()`).
            (None, Some(s)) => Ok(BlockHash::Int(s as u64)),
            (None, None) => Err(shape(format!("{what}: integer out of range"))),
        },
        Value::Binary(b) => Ok(BlockHash::Bytes(b)),
        other => Err(shape(format!("{what}: hash is {}", kind(&other)))),
    }
}

fn hashes(value: Value, what: &str) -> Result<Vec<BlockHash>, DecodeError> {
    match value {
        Value::Array(values) => values.into_iter().map(|v| hash(v, what)).collect(),
        other => Err(shape(format!("{what} is {}", kind(&other)))),
    }
}

fn opt_str(value: Value, what: &str) -> Result<Option<String>, DecodeError> {
    match value {
        Value::Nil => Ok(None),
        Value::String(s) => Ok(Some(s.into_str().unwrap_or_default())),
        other => Err(shape(format!("{what} is {}", kind(&other)))),
    }
}

fn opt_u32(value: Value, what: &str) -> Result<Option<u32>, DecodeError> {
    match value {
        Value::Nil => Ok(None),
        v => v
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .map(Some)
            .ok_or_else(|| shape(format!("{what} not a u32"))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::F32(_) | Value::F64(_) => "a float",
        Value::String(_) => "a string",
        Value::Binary(_) => "binary",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        Value::Ext(..) => "an extension",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pack(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, v).unwrap();
        out
    }

    fn s(x: &str) -> Value {
        Value::from(x)
    }

    fn map(pairs: Vec<(&str, Value)>) -> Value {
        Value::Map(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
    }

    fn stored_map(extra: Vec<(&str, Value)>) -> Value {
        let mut pairs = vec![
            ("type", s("BlockStored")),
            (
                "block_hashes",
                Value::Array(vec![Value::from(1u64), Value::from(u64::MAX)]),
            ),
            ("parent_block_hash", Value::Nil),
            (
                "token_ids",
                Value::Array((0..4u32).map(Value::from).collect()),
            ),
            ("block_size", Value::from(2)),
            ("lora_id", Value::Nil),
            ("medium", s("GPU")),
            ("lora_name", Value::Nil),
        ];
        pairs.extend(extra);
        map(pairs)
    }

    #[test]
    fn an_array_batch_of_tagged_map_events_decodes_as_vllm_0_32_sends_it() {
        let batch = Value::Array(vec![
            Value::F64(12.5),
            Value::Array(vec![
                stored_map(vec![(
                    "extra_keys",
                    Value::Array(vec![Value::Nil, Value::Nil]),
                )]),
                map(vec![
                    ("type", s("BlockRemoved")),
                    (
                        "block_hashes",
                        Value::Array(vec![Value::Binary(vec![0xab; 32])]),
                    ),
                    ("medium", Value::Nil),
                ]),
                map(vec![("type", s("AllBlocksCleared"))]),
            ]),
            Value::from(0),
        ]);
        let b = decode(&pack(&batch)).unwrap();
        assert_eq!(b.ts, 12.5);
        assert_eq!(b.data_parallel_rank, Some(0));
        assert_eq!(b.unknown_fields, 0);
        let Event::BlockStored(st) = &b.events[0] else {
            panic!("{:?}", b.events[0])
        };
        assert_eq!(
            st.block_hashes,
            vec![BlockHash::Int(1), BlockHash::Int(u64::MAX)]
        );
        assert_eq!(st.token_ids, vec![0, 1, 2, 3]);
        assert_eq!((st.block_size, st.medium.as_deref()), (2, Some("GPU")));
        assert!(!st.has_extra_keys, "a list of nulls is no extra keys");
        let Event::BlockRemoved(r) = &b.events[1] else {
            panic!()
        };
        assert_eq!(r.block_hashes[0].as_u64(), 0xabab_abab_abab_abab);
        assert_eq!(b.events[2], Event::AllBlocksCleared);
    }

    #[test]
    fn a_map_batch_and_array_events_decode_too() {
        let event = Value::Array(vec![
            s("BlockStored"),
            Value::Array(vec![Value::from(-1i64)]),
            Value::from(7u64),
            Value::Array(vec![Value::from(5u32), Value::from(6u32)]),
            Value::from(2),
            Value::Nil,
            s("CPU"),
            Value::Nil,
            Value::Array(vec![Value::Array(vec![s("salt")])]),
            Value::from(1),
        ]);
        let batch = map(vec![
            ("ts", Value::from(3)),
            ("events", Value::Array(vec![event])),
        ]);
        let b = decode(&pack(&batch)).unwrap();
        assert_eq!(b.data_parallel_rank, None);
        let Event::BlockStored(st) = &b.events[0] else {
            panic!()
        };
        assert_eq!(
            st.block_hashes,
            vec![BlockHash::Int(u64::MAX)],
            "-1 as its bits"
        );
        assert_eq!(st.parent_block_hash, Some(BlockHash::Int(7)));
        assert_eq!(st.medium.as_deref(), Some("CPU"));
        assert!(st.has_extra_keys);
        assert_eq!(st.group_idx, Some(1));
    }

    #[test]
    fn unknown_event_types_and_fields_are_kept_and_counted() {
        let batch = Value::Array(vec![
            Value::F64(1.0),
            Value::Array(vec![
                map(vec![("type", s("BlockPinned")), ("x", Value::from(1))]),
                stored_map(vec![("session_id", s("s")), ("future", Value::from(2))]),
                Value::from(42),
                map(vec![("no_type", Value::Nil)]),
            ]),
            Value::Nil,
            s("a fourth batch field"),
        ]);
        let b = decode(&pack(&batch)).unwrap();
        assert_eq!(b.events[0], Event::Unknown("BlockPinned".into()));
        assert!(matches!(b.events[1], Event::BlockStored(_)));
        assert_eq!(b.events[2], Event::Unknown("?".into()));
        assert_eq!(b.events[3], Event::Unknown("?".into()));
        assert_eq!(b.unknown_events(), 3);
        assert_eq!(
            b.unknown_fields, 3,
            "session_id, future, the batch's fourth field"
        );
    }

    #[test]
    fn known_events_of_the_wrong_shape_are_errors() {
        for bad in [
            stored_map(vec![("token_ids", s("no"))]),
            stored_map(vec![("block_size", Value::from(0))]),
            stored_map(vec![("extra_keys", Value::from(1))]),
            map(vec![
                ("type", s("BlockRemoved")),
                ("block_hashes", Value::Nil),
            ]),
        ] {
            // A later duplicate key is not seen by `take` (the first wins): put bad fields first.
            let bad = match bad {
                Value::Map(mut pairs) => {
                    pairs.reverse();
                    Value::Map(pairs)
                }
                v => v,
            };
            let batch = Value::Array(vec![Value::F64(1.0), Value::Array(vec![bad])]);
            let err = decode(&pack(&batch)).unwrap_err();
            assert_eq!(err.metric_label(), "shape", "{err}");
        }
        assert_eq!(decode(&pack(&s("x"))).unwrap_err().metric_label(), "shape");
        assert_eq!(decode(&[]).unwrap_err().metric_label(), "msgpack");
    }

    #[test]
    fn frames_and_sequence_numbers_are_checked() {
        let payload = pack(&Value::Array(vec![Value::F64(1.0), Value::Array(vec![])]));
        let m =
            decode_message(&[b"t".to_vec(), 5u64.to_be_bytes().to_vec(), payload.clone()]).unwrap();
        assert_eq!((m.topic.as_slice(), m.seq), (&b"t"[..], 5));
        assert_eq!(
            decode_message(&[b"t".to_vec(), vec![1, 2], payload.clone()]).unwrap_err(),
            DecodeError::SeqFrame(2)
        );
        assert_eq!(
            decode_message(&[payload]).unwrap_err(),
            DecodeError::Frames(1)
        );
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let mut bytes = vec![0x91; 100_000]; // 100,000 nested one-element arrays
        bytes.push(0xc0);
        assert_eq!(decode(&bytes).unwrap_err().metric_label(), "msgpack");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
        }
    }
}
