//! The tensors of a packed batch (see `crate::feed::batcher::pack`): its
//! sequences' documents laid end to end, with what a language model needs to
//! keep them apart.
//!
//! | tensor         | shape (`[B, L]` layout; flat: `[T]`) | dtype     | value |
//! |----------------|--------------------------------------|-----------|-------|
//! | `input_ids`    | `[B, max_tokens]` / `[T]`            | int64 (or the token column's `dtype`, int32) | the tokens; padding is the column's `pad_value` |
//! | `position_ids` | as `input_ids`                       | int64     | 0, 1, … restarting at every document; 0 in padding |
//! | `labels`       | as `input_ids`                       | int64     | the token, but -100 at every document's first token and in padding |
//! | `cu_seqlens`   | `[n + 1]`                            | int32     | offsets of the documents in the flattened batch, from 0 to its size |
//!
//! `labels` follow Hugging Face's convention: the model shifts them (logit
//! `t` is scored against label `t + 1`), so the -100 at a document's first
//! token is what stops the last token of the document before it from
//! predicting across the boundary. `cu_seqlens` are FlashAttention's
//! `varlen` offsets over the batch flattened to `B × max_tokens` tokens
//! (flat: `T`); in the `[B, L]` layout each sequence's padding is a segment
//! of its own, so that the offsets cover every token (`max_seqlen` is
//! `cu_seqlens.diff().max()`). An empty sequence (the epoch's last step,
//! fewer sequences than ranks) is all padding.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Int64Type, Schema};
use datafusion::common::{exec_err, internal_err, plan_err};
use datafusion::error::Result;

use super::{BatchRows, PadStats};
use crate::device::{DType, Slot, SlotPool, TensorLayout, cast_slice_mut};
use crate::feed::columns::{self, ColumnSpec};

/// A piece of a document in a sequence: `len` tokens of row `row` of the
/// batch's gathered rows, from token `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) row: usize,
    pub(crate) start: usize,
    pub(crate) len: usize,
}

/// How a packed batch's rows make its sequences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Packed {
    /// This rank's sequences of the step (`per_rank` of them, the last
    /// ones possibly empty).
    pub(crate) sequences: Vec<Vec<Segment>>,
    /// Tokens per sequence.
    pub(crate) max_tokens: usize,
    /// One flat stream rather than `[B, max_tokens]`.
    pub(crate) flat: bool,
}

/// The label of a token no loss is computed for (PyTorch's `ignore_index`).
pub const IGNORED_LABEL: i64 = -100;

/// The tensors a packing feed writes, resolved from its query's schema.
#[derive(Debug, Clone)]
pub(crate) struct PackedTensors {
    /// The token column (for messages).
    pub(crate) name: Arc<str>,
    /// Its index in the query's output.
    pub(crate) index: usize,
    /// `input_ids`' element type (int64 or int32).
    pub(crate) dtype: DType,
    /// What padding tokens hold.
    pub(crate) pad_value: i64,
}

impl PackedTensors {
    /// The one column of `schema` (a list of integer token ids) that a
    /// packing feed packs, with its tensor options from `specs`.
    pub(crate) fn resolve(
        schema: &Schema,
        specs: &[(String, ColumnSpec)],
    ) -> Result<Self> {
        let [field] = schema.fields().iter().collect::<Vec<_>>()[..] else {
            return plan_err!(
                "a packing feed (pack=…) packs one column of token ids, but the query \
                 returns {}: select only the tokens (for example \
                 `SELECT tokenize(text, 'tokenizer.json') AS tokens FROM …`)",
                crate::exec::column_names(schema)
            );
        };
        let values = match field.data_type() {
            DataType::List(values) | DataType::LargeList(values) => values.data_type(),
            other => {
                return plan_err!(
                    "a packing feed packs a list of token ids, but column '{}' is {other}",
                    field.name()
                );
            }
        };
        if !values.is_integer() {
            return plan_err!(
                "a packing feed packs integer token ids, but column '{}' is a list of \
                 {values}",
                field.name()
            );
        }
        let spec = columns::spec_of(specs, field.name());
        for (name, _) in specs {
            if name != field.name() {
                return plan_err!(
                    "a tensor option names column '{name}', but the packing feed's query \
                     returns only '{}'",
                    field.name()
                );
            }
        }
        let dtype = match spec.dtype.unwrap_or(DType::Int64) {
            dtype @ (DType::Int64 | DType::Int32) => dtype,
            other => {
                return plan_err!(
                    "the packed token column '{}' becomes input_ids of int64 or int32, \
                     not {other:?}",
                    field.name()
                );
            }
        };
        if spec.shape.is_some() || spec.pad_to.is_some() || spec.scale.is_some() {
            return plan_err!(
                "the packed token column '{}' takes only dtype and pad_value: its \
                 shape is [B, max_tokens] (or [T] flat)",
                field.name()
            );
        }
        Ok(Self {
            name: Arc::from(field.name().as_str()),
            index: 0,
            dtype,
            pad_value: spec.pad_value as i64,
        })
    }
}

impl PackedTensors {
    /// The tensors each batch has, in order.
    pub(crate) fn tensor_infos(&self) -> Vec<crate::feed::TensorInfo> {
        let info = |name: &str, dtype| crate::feed::TensorInfo {
            name: name.to_string(),
            dtype,
        };
        vec![
            info("input_ids", self.dtype),
            info("position_ids", DType::Int64),
            info("labels", DType::Int64),
            info("cu_seqlens", DType::Int32),
        ]
    }
}

/// The token ids of the rows of a packed batch, as int64 values and
/// per-row offsets.
struct Tokens {
    values: ArrayRef,
    offsets: Vec<usize>,
}

impl Tokens {
    fn of(array: &ArrayRef) -> Result<Self> {
        let (values, offsets): (ArrayRef, Vec<usize>) = match array.data_type() {
            DataType::List(_) => {
                let list = array.as_list::<i32>();
                let offsets = list.value_offsets().iter().map(|&o| o as usize).collect();
                (Arc::clone(list.values()), offsets)
            }
            DataType::LargeList(_) => {
                let list = array.as_list::<i64>();
                let offsets = list.value_offsets().iter().map(|&o| o as usize).collect();
                (Arc::clone(list.values()), offsets)
            }
            other => return internal_err!("packed rows of type {other}"),
        };
        let values = datafusion::arrow::compute::cast(&values, &DataType::Int64)?;
        Ok(Self { values, offsets })
    }
}

/// Lays out and writes one packed batch.
pub(crate) fn fill_packed_slot(
    tensors: &PackedTensors,
    rows: &BatchRows,
    pool: &mut SlotPool,
    slot: &mut Slot,
) -> Result<PadStats> {
    let Some(packed) = &rows.packed else {
        return internal_err!("a packing feed's batch without its packing");
    };
    let tokens = match rows.pieces.first() {
        Some(piece) if piece.num_rows() > 0 => {
            Some(Tokens::of(piece.column(tensors.index))?)
        }
        _ => None,
    };
    let width = packed.max_tokens;
    let used: usize = packed.sequences.iter().flatten().map(|s| s.len).sum();
    let length = match packed.flat {
        true => used,
        false => packed.sequences.len() * width,
    };
    // `length` is where the offsets end: checked once, every offset fits.
    if i32::try_from(length).is_err() {
        return exec_err!(
            "a packed batch of {length} tokens: cu_seqlens are int32, so a batch holds \
             at most {} tokens; use fewer sequences per batch",
            i32::MAX
        );
    }
    // Document offsets in the flattened batch.
    let mut offsets: Vec<i32> = vec![0];
    let mut at = 0usize;
    for sequence in &packed.sequences {
        for segment in sequence {
            at += segment.len;
            offsets.push(at as i32);
        }
        if !packed.flat {
            let filled: usize = sequence.iter().map(|s| s.len).sum();
            if filled < width {
                at += width - filled;
                offsets.push(at as i32);
            }
        }
    }
    let shape = match packed.flat {
        true => vec![length],
        false => vec![packed.sequences.len(), width],
    };
    let layout = |name: &str, dtype: DType, shape: Vec<usize>| TensorLayout {
        name: Arc::from(name),
        dtype,
        shape,
    };
    pool.prepare(
        slot,
        vec![
            layout("input_ids", tensors.dtype, shape.clone()),
            layout("position_ids", DType::Int64, shape.clone()),
            layout("labels", DType::Int64, shape),
            layout("cu_seqlens", DType::Int32, vec![offsets.len()]),
        ],
    )?;
    let mut input_ids = vec![tensors.pad_value; length];
    let mut positions = vec![0i64; length];
    let mut labels = vec![IGNORED_LABEL; length];
    let mut at = 0;
    for (number, sequence) in packed.sequences.iter().enumerate() {
        if !packed.flat {
            at = number * width;
        }
        for segment in sequence {
            let Some(tokens) = &tokens else {
                return internal_err!("a packed batch's segments without rows");
            };
            let values = tokens.values.as_primitive::<Int64Type>();
            let first = tokens.offsets[segment.row] + segment.start;
            for offset in 0..segment.len {
                let value = first + offset;
                if values.is_null(value) {
                    return exec_err!(
                        "column '{}' (packed, epoch {}, step {}): token {} of a document \
                         is NULL; token ids must not be NULL (filter or fill them in SQL)",
                        tensors.name,
                        rows.epoch,
                        rows.step,
                        segment.start + offset
                    );
                }
                let token = values.value(value);
                input_ids[at + offset] = token;
                positions[at + offset] = offset as i64;
                if offset > 0 {
                    labels[at + offset] = token;
                }
            }
            at += segment.len;
        }
    }
    match tensors.dtype {
        DType::Int32 => {
            let out = cast_slice_mut::<i32>(slot.host_mut(0)?)?;
            for (out, &token) in out.iter_mut().zip(&input_ids) {
                *out = i32::try_from(token).map_err(|_| {
                    datafusion::common::exec_datafusion_err!(
                        "column '{}' (packed, epoch {}, step {}): token id {token} does \
                         not fit input_ids' int32; use dtype int64",
                        tensors.name,
                        rows.epoch,
                        rows.step
                    )
                })?;
            }
        }
        _ => cast_slice_mut::<i64>(slot.host_mut(0)?)?.copy_from_slice(&input_ids),
    }
    cast_slice_mut::<i64>(slot.host_mut(1)?)?.copy_from_slice(&positions);
    cast_slice_mut::<i64>(slot.host_mut(2)?)?.copy_from_slice(&labels);
    cast_slice_mut::<i32>(slot.host_mut(3)?)?.copy_from_slice(&offsets);
    Ok(PadStats {
        padding: (length - used) as u64,
        total: length as u64,
    })
}
