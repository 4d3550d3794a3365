//! Decoding, guided by the schema: the `flatbuffers` crate's verifier checks
//! each table, offset, string and scalar before its reader follows it (within
//! the buffer, aligned, strings UTF-8 and terminated, tables nested at most
//! [`MAX_DEPTH`] deep), so a buffer that does not fit fails that message.

use flatbuffers::{
    Follow, ForwardsUOffset, InvalidFlatbuffer, Verifiable, Verifier, VerifierOptions,
};
use serde_json::{Map, Number, Value};

use super::{Element, FieldDef, Inner, MAX_DEPTH, MAX_VALUES, Scalar, Type, invalid};
use crate::codec::CodecError;

/// The JSON of the buffer `buf`, whose root is a table of the schema's root type.
pub(super) fn decode(buf: &[u8], schema: &Inner) -> Result<Value, CodecError> {
    let options = VerifierOptions {
        max_depth: MAX_DEPTH,
        max_tables: MAX_VALUES,
        ..VerifierOptions::default()
    };
    let mut verifier = Verifier::new(&options, buf);
    let mut reader = Reader {
        buf,
        schema,
        values: 0,
    };
    let root = reader.offset_target(&mut verifier, 0)?;
    reader.table(&mut verifier, schema.root, root)
}

/// Reads what the verifier (created over the same `buf`) has checked.
struct Reader<'a> {
    buf: &'a [u8],
    schema: &'a Inner,
    values: usize,
}

impl<'a> Reader<'a> {
    /// The table at `position`: each field present, or its default.
    fn table(
        &mut self,
        verifier: &mut Verifier<'_, 'a>,
        object: usize,
        position: usize,
    ) -> Result<Value, CodecError> {
        self.count()?;
        let definition = self.schema.object(object)?;
        let mut table = verifier.visit_table(position).map_err(broken)?;
        let mut map = Map::new();
        for field in &definition.fields {
            let at = table.deref(field.offset).map_err(broken)?;
            let value = match (field.ty, at) {
                (Type::Scalar { scalar, enum_index }, Some(at)) => {
                    self.scalar(table.verifier(), scalar, enum_index, at)?
                }
                (Type::Scalar { .. }, None) if field.optional => Value::Null,
                (Type::Scalar { scalar, enum_index }, None) => {
                    self.default(field, scalar, enum_index)
                }
                (_, None) if field.required => {
                    return Err(invalid(format!(
                        "required field {}.{} is missing",
                        definition.name, field.name
                    )));
                }
                (_, None) => continue,
                (Type::Union(enum_index), Some(at)) => {
                    // The member is named by the `{field}_type` field beside it.
                    let Some(type_field) = definition
                        .fields
                        .iter()
                        .find(|other| other.name == format!("{}_type", field.name))
                    else {
                        continue;
                    };
                    let Some(tag_at) = table.deref(type_field.offset).map_err(broken)? else {
                        continue;
                    };
                    let tag = i64::from(self.read::<u8>(table.verifier(), tag_at)?);
                    let member = self
                        .schema
                        .enums
                        .get(enum_index)
                        .and_then(|e| e.values.iter().find(|value| value.value == tag))
                        .and_then(|value| value.table);
                    match member {
                        Some(member) => {
                            let target = self.offset_target(table.verifier(), at)?;
                            self.table(table.verifier(), member, target)?
                        }
                        None => continue,
                    }
                }
                (ty, Some(at)) => self.value(table.verifier(), ty, at)?,
            };
            map.insert(field.name.clone(), value);
        }
        table.finish();
        Ok(Value::Object(map))
    }

    /// A non-scalar field's value stored at `at`.
    fn value(
        &mut self,
        verifier: &mut Verifier<'_, 'a>,
        ty: Type,
        at: usize,
    ) -> Result<Value, CodecError> {
        match ty {
            Type::String => self.string(verifier, at),
            Type::Object(object) => self.object(verifier, object, at),
            Type::Vector(element) => {
                let target = self.offset_target(verifier, at)?;
                let len = self.read::<u32>(verifier, target)? as usize;
                self.elements(verifier, element, target + 4, len)
            }
            Type::Array(element, len) => self.elements(verifier, element, at, len),
            Type::Scalar { scalar, enum_index } => self.scalar(verifier, scalar, enum_index, at),
            Type::Union(_) => Ok(Value::Null),
        }
    }

    /// `len` elements side by side from `start`: a vector's or a fixed array's.
    fn elements(
        &mut self,
        verifier: &mut Verifier<'_, 'a>,
        element: Element,
        start: usize,
        len: usize,
    ) -> Result<Value, CodecError> {
        let stride = match element {
            Element::Scalar { scalar, .. } => scalar.size(),
            Element::Object(object) if self.schema.is_struct(object) => {
                self.schema.object(object)?.bytesize.max(1)
            }
            Element::String | Element::Object(_) => 4,
        };
        // Checked up front, so a huge length in a small buffer fails at once.
        verifier
            .range_in_buffer(start, len.saturating_mul(stride))
            .map_err(broken)?;
        let mut items = Vec::with_capacity(len);
        for index in 0..len {
            let at = start + index * stride;
            self.count()?;
            items.push(match element {
                Element::Scalar { scalar, enum_index } => {
                    self.scalar(verifier, scalar, enum_index, at)?
                }
                Element::String => self.string(verifier, at)?,
                Element::Object(object) => self.object(verifier, object, at)?,
            });
        }
        Ok(Value::Array(items))
    }

    /// The struct stored inline at `at`, or the table the offset there points to.
    fn object(
        &mut self,
        verifier: &mut Verifier<'_, 'a>,
        object: usize,
        at: usize,
    ) -> Result<Value, CodecError> {
        if !self.schema.is_struct(object) {
            let target = self.offset_target(verifier, at)?;
            return self.table(verifier, object, target);
        }
        self.count()?;
        let definition = self.schema.object(object)?;
        verifier
            .range_in_buffer(at, definition.bytesize)
            .map_err(broken)?;
        let mut map = Map::new();
        for field in &definition.fields {
            let value = self.value(verifier, field.ty, at + usize::from(field.offset))?;
            map.insert(field.name.clone(), value);
        }
        Ok(Value::Object(map))
    }

    /// The string the offset at `at` points to.
    fn string(&mut self, verifier: &mut Verifier<'_, 'a>, at: usize) -> Result<Value, CodecError> {
        self.read::<ForwardsUOffset<&str>>(verifier, at)
            .map(|text| Value::String(text.to_owned()))
    }

    fn scalar(
        &self,
        verifier: &mut Verifier<'_, 'a>,
        scalar: Scalar,
        enum_index: Option<usize>,
        at: usize,
    ) -> Result<Value, CodecError> {
        let integer = match scalar {
            Scalar::Bool => return Ok(Value::Bool(self.read::<bool>(verifier, at)?)),
            Scalar::F32 => return Ok(float(self.read::<f32>(verifier, at)?.into(), true)),
            Scalar::F64 => return Ok(float(self.read::<f64>(verifier, at)?, false)),
            Scalar::U64 => {
                let value = self.read::<u64>(verifier, at)?;
                return Ok(match i64::try_from(value) {
                    Ok(signed) => self.integer(enum_index, signed),
                    Err(_) => Value::Number(value.into()),
                });
            }
            Scalar::I8 => i64::from(self.read::<i8>(verifier, at)?),
            Scalar::U8 => i64::from(self.read::<u8>(verifier, at)?),
            Scalar::I16 => i64::from(self.read::<i16>(verifier, at)?),
            Scalar::U16 => i64::from(self.read::<u16>(verifier, at)?),
            Scalar::I32 => i64::from(self.read::<i32>(verifier, at)?),
            Scalar::U32 => i64::from(self.read::<u32>(verifier, at)?),
            Scalar::I64 => self.read::<i64>(verifier, at)?,
        };
        Ok(self.integer(enum_index, integer))
    }

    fn integer(&self, enum_index: Option<usize>, value: i64) -> Value {
        match self.schema.enum_name(enum_index, value) {
            Some(name) => Value::String(name.to_owned()),
            None => Value::Number(value.into()),
        }
    }

    fn default(&self, field: &FieldDef, scalar: Scalar, enum_index: Option<usize>) -> Value {
        match scalar {
            Scalar::Bool => Value::Bool(field.default_integer != 0),
            Scalar::F32 => float(field.default_real, true),
            Scalar::F64 => float(field.default_real, false),
            // The schema keeps a ulong default as the same 64 bits.
            Scalar::U64 if field.default_integer < 0 => {
                Value::Number((field.default_integer as u64).into())
            }
            _ => self.integer(enum_index, field.default_integer),
        }
    }

    /// Where the offset stored at `position` points.
    fn offset_target(
        &self,
        verifier: &mut Verifier<'_, 'a>,
        position: usize,
    ) -> Result<usize, CodecError> {
        let offset = verifier.get_uoffset(position).map_err(broken)?;
        Ok(position.saturating_add(offset as usize))
    }

    /// The `T` at `at`, once the verifier has checked that one lies there.
    fn read<T: Verifiable + Follow<'a>>(
        &self,
        verifier: &mut Verifier<'_, 'a>,
        at: usize,
    ) -> Result<T::Inner, CodecError> {
        T::run_verifier(verifier, at).map_err(broken)?;
        // SAFETY: the verifier runs over `self.buf` (see `decode`) and has just
        // checked that a whole `T` lies at `at`, which is all `follow` needs.
        Ok(unsafe { T::follow(self.buf, at) })
    }

    /// Values one buffer decodes to are capped: offsets may point many times
    /// at the same table, so a small buffer could otherwise expand without bound.
    fn count(&mut self) -> Result<(), CodecError> {
        self.values += 1;
        if self.values > MAX_VALUES {
            return Err(invalid(format!(
                "the buffer decodes to more than {MAX_VALUES} values"
            )));
        }
        Ok(())
    }
}

/// The verifier's refusal as the codec's error.
fn broken(error: InvalidFlatbuffer) -> CodecError {
    match error {
        InvalidFlatbuffer::RangeOutOfBounds { range, .. } => invalid(format!(
            "a read of bytes {}..{} runs past the end of the buffer",
            range.start, range.end
        )),
        other => invalid(other.to_string().trim_end()),
    }
}

/// A float as JSON; an `f32` by its shortest decimal form, so 0.1 stays 0.1.
fn float(value: f64, single: bool) -> Value {
    if value.is_nan() {
        return Value::String("NaN".into());
    }
    if value.is_infinite() {
        let sign = if value > 0.0 { "" } else { "-" };
        return Value::String(format!("{sign}Infinity"));
    }
    let value = if single {
        (value as f32).to_string().parse().unwrap_or(value)
    } else {
        value
    };
    Number::from_f64(value).map_or(Value::Null, Value::Number)
}
