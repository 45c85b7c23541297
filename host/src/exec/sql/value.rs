//! Values between a guest and PostgreSQL ([`Value`]): parameters encoded for the type the
//! server expects, and columns read back ([`column()`]) within the job's size limit.

use std::error::Error;

use tokio_postgres::types::{Format, FromSql, IsNull, ToSql, Type, to_sql_checked};

/// A parameter or a column's value. As a parameter, a native case is sent in binary where the
/// statement's parameter has its type; otherwise as text, which the server reads with the
/// parameter type's own input function (so `text` fills a `numeric` or `timestamptz` parameter,
/// and `int` a `numeric` one). As a column, see [`column()`].
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// NULL.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// Text.
    Text(String),
    /// Bytes (binary to `bytea` only).
    Bytes(Vec<u8>),
}

impl Value {
    /// Bytes the value counts against the job's result limit.
    pub fn size(&self) -> usize {
        match self {
            Value::Null | Value::Bool(_) => 1,
            Value::Int(_) | Value::Float(_) => 8,
            Value::Text(s) => s.len(),
            Value::Bytes(b) => b.len(),
        }
    }

    /// The parameter's text form, for a parameter type it has no binary form for.
    fn text(&self) -> Option<String> {
        match self {
            Value::Null | Value::Bytes(_) => None,
            Value::Bool(b) => Some(if *b { "true" } else { "false" }.into()),
            Value::Int(i) => Some(i.to_string()),
            Value::Float(f) => Some(f.to_string()),
            Value::Text(s) => Some(s.clone()),
        }
    }

    /// Whether the parameter goes in binary for `ty`.
    fn binary(&self, ty: &Type) -> bool {
        match self {
            Value::Null => true,
            Value::Bool(_) => *ty == Type::BOOL,
            Value::Int(_) => [Type::INT2, Type::INT4, Type::INT8].contains(ty),
            Value::Float(_) => [Type::FLOAT4, Type::FLOAT8].contains(ty),
            Value::Text(_) => false,
            Value::Bytes(_) => true,
        }
    }
}

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        if !self.binary(ty) {
            let text = self
                .text()
                .ok_or_else(|| format!("a {self:?} cannot be sent as {ty}"))?;
            out.extend_from_slice(text.as_bytes());
            return Ok(IsNull::No);
        }
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Bool(b) => b.to_sql(ty, out),
            Value::Int(i) => match *ty {
                Type::INT2 => i16::try_from(*i)
                    .map_err(|_| format!("{i} does not fit a smallint parameter"))?
                    .to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)
                    .map_err(|_| format!("{i} does not fit an integer parameter"))?
                    .to_sql(ty, out),
                _ => i.to_sql(ty, out),
            },
            Value::Float(f) if *ty == Type::FLOAT4 => (*f as f32).to_sql(ty, out),
            Value::Float(f) => f.to_sql(ty, out),
            Value::Bytes(b) if *ty == Type::BYTEA => b.as_slice().to_sql(ty, out),
            Value::Bytes(_) => {
                Err(format!("bytes can only fill a bytea parameter, not {ty}").into())
            }
            Value::Text(_) => unreachable!("text is always sent as text"),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, ty: &Type) -> Format {
        if self.binary(ty) {
            Format::Binary
        } else {
            Format::Text
        }
    }

    to_sql_checked!();
}

/// A column's raw binary value, whatever its type.
struct Raw<'a>(Option<&'a [u8]>);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        Ok(Raw(Some(raw)))
    }

    fn from_sql_null(_: &Type) -> Result<Self, Box<dyn Error + Sync + Send>> {
        Ok(Raw(None))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// Column `i` of `row`; an error names the column and the cast to add, or what is malformed.
pub fn column(row: &tokio_postgres::Row, i: usize) -> Result<Value, String> {
    let col = &row.columns()[i];
    let ty = col.type_();
    let Raw(raw) = row
        .try_get::<_, Raw>(i)
        .map_err(|e| format!("column {}: {e}", col.name()))?;
    let Some(raw) = raw else {
        return Ok(Value::Null);
    };
    let bad = || format!("column {} ({ty}): malformed value", col.name());
    let fixed =
        |n: usize| -> Result<&[u8], String> { if raw.len() == n { Ok(raw) } else { Err(bad()) } };
    let text = |b: &[u8]| {
        String::from_utf8(b.to_vec()).map_err(|_| format!("column {}: not UTF-8", col.name()))
    };
    Ok(match *ty {
        Type::BOOL => Value::Bool(fixed(1)?[0] != 0),
        Type::INT2 => Value::Int(i16::from_be_bytes(fixed(2)?.try_into().unwrap()).into()),
        Type::INT4 => Value::Int(i32::from_be_bytes(fixed(4)?.try_into().unwrap()).into()),
        Type::INT8 => Value::Int(i64::from_be_bytes(fixed(8)?.try_into().unwrap())),
        Type::OID => Value::Int(u32::from_be_bytes(fixed(4)?.try_into().unwrap()).into()),
        Type::FLOAT4 => Value::Float(f32::from_be_bytes(fixed(4)?.try_into().unwrap()).into()),
        Type::FLOAT8 => Value::Float(f64::from_be_bytes(fixed(8)?.try_into().unwrap())),
        Type::BYTEA => Value::Bytes(raw.to_vec()),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::JSON | Type::UNKNOWN => {
            Value::Text(text(raw)?)
        }
        // jsonb's binary form: a version byte (1), then the text.
        Type::JSONB => match raw.split_first() {
            Some((1, rest)) => Value::Text(text(rest)?),
            _ => return Err(bad()),
        },
        Type::UUID => {
            let h = hex::encode(fixed(16)?);
            Value::Text(format!(
                "{}-{}-{}-{}-{}",
                &h[..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..]
            ))
        }
        _ => {
            return Err(format!(
                "column {} has type {ty}, which a job cannot read as a value: cast it in the query ({}::text, or ::bigint, ::float8)",
                col.name(),
                col.name()
            ));
        }
    })
}
