//! Tensor shapes from safetensors files, without reading any weights.
//!
//! A safetensors file starts with an 8-byte little-endian header length and a
//! JSON header naming each tensor with its dtype, shape and byte range; the
//! weights follow. The header is all `estimate-memory` needs, so a model of
//! hundreds of gigabytes is measured by reading a few kilobytes per file.
//! Headers are checked the way the safetensors loader checks them (length
//! within the file, byte ranges inside the data, range length matching the
//! shape for dtypes of whole bytes), so a truncated or foreign file is
//! reported instead of silently miscounted.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde_json::{Map, Value};

use super::EstimateError;

/// safetensors refuses headers longer than this (its `MAX_HEADER_SIZE`).
const MAX_HEADER: u64 = 100_000_000;

/// The index of a sharded model, as transformers writes it.
pub(super) const INDEX: &str = "model.safetensors.index.json";
/// The single-file model, as transformers writes it.
pub(super) const SINGLE: &str = "model.safetensors";

/// Tensor name → number of elements.
pub(super) type Tensors = BTreeMap<String, u64>;

/// The tensors of a local model: a folder with `model.safetensors.index.json`
/// (sharded) or `model.safetensors`, or one such file given directly.
pub(super) fn read_model(path: &Path) -> Result<Tensors, EstimateError> {
    if !path.is_dir() {
        return match path.to_string_lossy().ends_with(".json") {
            true => read_index(path),
            false => read_file(path),
        };
    }
    let index = path.join(INDEX);
    if index.is_file() {
        return read_index(&index);
    }
    let single = path.join(SINGLE);
    if single.is_file() {
        return read_file(&single);
    }
    Err(EstimateError::NoWeights {
        dir: path.to_owned(),
        hint: missing_weights_hint(path),
    })
}

/// What the folder holds instead, to say what to do about it.
fn missing_weights_hint(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let safetensors: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| n.ends_with(".safetensors") || n.ends_with(".safetensors.index.json"))
        .collect();
    if !safetensors.is_empty() {
        return format!(
            "; it has {}: pass the file (or its .index.json) instead of the folder",
            safetensors.join(", ")
        );
    }
    if names
        .iter()
        .any(|n| n.ends_with(".bin") || n.ends_with(".pt"))
    {
        return "; it has PyTorch pickle weights only, which accel does not read: save the model \
                with safetensors (save_pretrained does by default) and try again"
            .into();
    }
    String::new()
}

/// The tensors of a sharded model, from its index and the headers of the
/// shards it names (relative to the index's folder).
fn read_index(path: &Path) -> Result<Tensors, EstimateError> {
    let bad = |reason: String| EstimateError::Index {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|source| EstimateError::Io {
        path: path.to_owned(),
        source,
    })?;
    let json: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
    let mut shards: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (tensor, shard) in map {
        let shard = shard
            .as_str()
            .ok_or_else(|| bad(format!("the shard of `{tensor}` is not a file name")))?;
        shards.entry(shard).or_default().push(tensor);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tensors = Tensors::new();
    for (shard, listed) in shards {
        let found = read_file(&dir.join(shard))?;
        if let Some(missing) = listed.iter().find(|t| !found.contains_key(**t)) {
            return Err(bad(format!(
                "`{missing}` is listed in {shard}, which does not hold it"
            )));
        }
        tensors.extend(found);
    }
    Ok(tensors)
}

/// The tensors of one safetensors file, from its header alone.
pub(super) fn read_file(path: &Path) -> Result<Tensors, EstimateError> {
    let io = |source| EstimateError::Io {
        path: path.to_owned(),
        source,
    };
    let bad = |reason: String| EstimateError::Header {
        path: path.to_owned(),
        reason,
    };
    let mut file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    if file_len < 8 {
        return Err(bad(format!(
            "the file is {file_len} bytes, too short for the 8-byte header length"
        )));
    }
    let mut prefix = [0u8; 8];
    file.read_exact(&mut prefix).map_err(io)?;
    let header_len = u64::from_le_bytes(prefix);
    if header_len > MAX_HEADER {
        return Err(bad(format!(
            "the header length {header_len} exceeds safetensors' limit of {MAX_HEADER} bytes \
             (is this a safetensors file?)"
        )));
    }
    let data_len = (file_len - 8).checked_sub(header_len).ok_or_else(|| {
        bad(format!(
            "the header length {header_len} runs past the end of the file ({file_len} bytes)"
        ))
    })?;
    let mut header = Vec::new();
    file.take(header_len).read_to_end(&mut header).map_err(io)?;
    parse_header(&header, data_len).map_err(bad)
}

/// Tensor sizes from a header's JSON; `data_len` is the size of the data
/// section after the header, which every byte range must stay within.
pub(super) fn parse_header(header: &[u8], data_len: u64) -> Result<Tensors, String> {
    let json: Value =
        serde_json::from_slice(header).map_err(|e| format!("the header is not JSON: {e}"))?;
    let entries = json
        .as_object()
        .ok_or_else(|| "the header is not a JSON object".to_owned())?;
    let mut tensors = Tensors::new();
    for (name, entry) in entries {
        if name == "__metadata__" {
            continue;
        }
        let numel = parse_entry(entry, data_len).map_err(|e| format!("tensor `{name}`: {e}"))?;
        tensors.insert(name.clone(), numel);
    }
    Ok(tensors)
}

/// The element count of one header entry, after checking it.
fn parse_entry(entry: &Value, data_len: u64) -> Result<u64, String> {
    let entry: &Map<String, Value> = entry.as_object().ok_or("not a JSON object")?;
    let dtype = entry
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or("no \"dtype\" string")?;
    let shape = entry
        .get("shape")
        .and_then(Value::as_array)
        .ok_or("no \"shape\" array")?;
    let mut numel: u64 = 1;
    for dim in shape {
        let dim = dim.as_u64().ok_or_else(|| {
            format!("shape {shape:?} has a dimension that is not a non-negative integer")
        })?;
        numel = numel
            .checked_mul(dim)
            .ok_or_else(|| format!("shape {shape:?} has more elements than fit in 64 bits"))?;
    }
    let offsets: Vec<u64> = entry
        .get("data_offsets")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let [begin, end] = offsets[..] else {
        return Err("no \"data_offsets\" pair of non-negative integers".into());
    };
    if begin > end || end > data_len {
        return Err(format!(
            "data_offsets [{begin}, {end}] are outside the {data_len} bytes of data (truncated file?)"
        ));
    }
    if let Some(width) = dtype_width(dtype) {
        if numel.checked_mul(width) != Some(end - begin) {
            return Err(format!(
                "shape {shape:?} of {dtype} needs {} bytes but data_offsets span {}",
                numel.saturating_mul(width),
                end - begin
            ));
        }
    }
    Ok(numel)
}

/// Bytes per element of the safetensors dtypes stored in whole bytes; sub-byte
/// and unknown dtypes are not size-checked.
fn dtype_width(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F64" | "I64" | "U64" | "C64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 1,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(dtype: &str, shape: &[u64], begin: u64) -> Value {
        let numel: u64 = shape.iter().product();
        let width = dtype_width(dtype).unwrap_or(1);
        serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, begin + numel * width]})
    }

    #[test]
    fn header_entries_give_element_counts() {
        let header = serde_json::json!({
            "__metadata__": {"format": "pt"},
            "a.weight": entry("F16", &[3, 4], 0),
            "a.bias": entry("F32", &[4], 24),
            "scalar": entry("F32", &[], 40),
            "empty": entry("F32", &[0, 7], 44),
        });
        let bytes = serde_json::to_vec(&header).expect("json");
        let tensors = parse_header(&bytes, 44).expect("valid");
        let expected: Tensors = [("a.weight", 12), ("a.bias", 4), ("scalar", 1), ("empty", 0)]
            .into_iter()
            .map(|(n, c)| (n.to_owned(), c))
            .collect();
        assert_eq!(tensors, expected);
    }

    #[test]
    fn malformed_headers_say_what_is_wrong() {
        let check = |header: Value, data_len: u64, needle: &str| {
            let bytes = serde_json::to_vec(&header).expect("json");
            let err = parse_header(&bytes, data_len).expect_err("invalid");
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        };
        check(serde_json::json!([1, 2]), 0, "not a JSON object");
        check(
            serde_json::json!({"t": 5}),
            0,
            "tensor `t`: not a JSON object",
        );
        check(
            serde_json::json!({"t": {"shape": [1], "data_offsets": [0, 4]}}),
            4,
            "dtype",
        );
        check(
            serde_json::json!({"t": {"dtype": "F32", "data_offsets": [0, 4]}}),
            4,
            "shape",
        );
        check(
            serde_json::json!({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}),
            4,
            "non-negative",
        );
        check(
            serde_json::json!({"t": {"dtype": "F32", "shape": [1]}}),
            4,
            "data_offsets",
        );
        check(
            serde_json::json!({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}),
            16,
            "needs 16 bytes but data_offsets span 8",
        );
        check(
            serde_json::json!({"t": entry("F32", &[4], 0)}),
            15,
            "truncated",
        );
        check(
            serde_json::json!({"t": {"dtype": "F32", "shape": [u64::MAX, 2], "data_offsets": [0, 0]}}),
            0,
            "64 bits",
        );
        let err = parse_header(b"{not json", 0).expect_err("invalid");
        assert!(err.contains("not JSON"), "{err}");
    }

    #[test]
    fn unknown_dtypes_are_counted_without_a_size_check() {
        let header =
            serde_json::json!({"packed": {"dtype": "F4", "shape": [8], "data_offsets": [0, 4]}});
        let bytes = serde_json::to_vec(&header).expect("json");
        assert_eq!(parse_header(&bytes, 4).expect("valid")["packed"], 8);
    }
}
