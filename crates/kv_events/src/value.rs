//! msgpack in and out through `rmpv`'s generic values, with the checks every payload needs.

use rmpv::{Integer, Value};

use crate::error::DecodeError;

/// Deep enough for every payload this crate reads (a batch is four levels deep); a bound
/// at all keeps hostile nesting from exhausting the stack.
const MAX_DEPTH: usize = 16;

/// Exactly one msgpack value, nothing after it.
pub(crate) fn read(bytes: &[u8]) -> Result<Value, DecodeError> {
    let mut rd = bytes;
    let v = rmpv::decode::read_value_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    match rd.len() {
        0 => Ok(v),
        extra => Err(DecodeError::Trailing { extra }),
    }
}

pub(crate) fn write(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail: the only errors rmpv reports are the writer's.
    let written = rmpv::encode::write_value(&mut out, v);
    debug_assert!(written.is_ok());
    out
}

pub(crate) fn int(v: &Value) -> Option<&Integer> {
    match v {
        Value::Integer(i) => Some(i),
        _ => None,
    }
}

pub(crate) fn uint(v: &Value, what: &'static str) -> Result<u64, DecodeError> {
    int(v)
        .and_then(Integer::as_u64)
        .ok_or(DecodeError::shape(what, "expected a non-negative integer"))
}

pub(crate) fn u32_of(v: &Value, what: &'static str) -> Result<u32, DecodeError> {
    u32::try_from(uint(v, what)?).map_err(|_| DecodeError::shape(what, "out of range"))
}

/// An optional field: absent or nil is `None`.
pub(crate) fn opt(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_nil())
}

pub(crate) fn string(v: &Value, what: &'static str) -> Result<String, DecodeError> {
    v.as_str()
        .map(str::to_owned)
        .ok_or(DecodeError::shape(what, "expected a string"))
}

pub(crate) fn array<'a>(v: &'a Value, what: &'static str) -> Result<&'a [Value], DecodeError> {
    v.as_array()
        .map(Vec::as_slice)
        .ok_or(DecodeError::shape(what, "expected an array"))
}

/// Non-negative values as unsigned, so the encoding is the smallest one msgpack allows
/// (what msgspec writes too).
pub(crate) fn from_i64(x: i64) -> Value {
    match u64::try_from(x) {
        Ok(u) => Value::from(u),
        Err(_) => Value::from(x),
    }
}

pub(crate) fn opt_value<T>(x: Option<T>, f: impl FnOnce(T) -> Value) -> Value {
    x.map_or(Value::Nil, f)
}
