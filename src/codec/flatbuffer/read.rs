//! Decoding: bounds-checked reads of one buffer, guided by the schema.

use serde_json::{Map, Number, Value};

use super::{Element, FieldDef, Inner, MAX_DEPTH, MAX_VALUES, Scalar, Type, invalid};
use crate::codec::CodecError;

/// Bounds-checked reads of one buffer, guided by the schema.
pub(super) struct Reader<'a> {
    buf: &'a [u8],
    schema: &'a Inner,
    values: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(buf: &'a [u8], schema: &'a Inner) -> Self {
        Self {
            buf,
            schema,
            values: 0,
        }
    }

    fn bytes<const N: usize>(&self, position: usize) -> Result<[u8; N], CodecError> {
        position
            .checked_add(N)
            .and_then(|end| self.buf.get(position..end))
            .and_then(|slice| slice.try_into().ok())
            .ok_or_else(|| {
                invalid(format!(
                    "a read of {N} bytes at {position} runs past the end of the {}-byte buffer",
                    self.buf.len()
                ))
            })
    }

    fn u16(&self, position: usize) -> Result<u16, CodecError> {
        self.bytes(position).map(u16::from_le_bytes)
    }

    fn u32(&self, position: usize) -> Result<usize, CodecError> {
        self.bytes(position)
            .map(|bytes| u32::from_le_bytes(bytes) as usize)
    }

    /// Where the unsigned offset stored at `position` points.
    pub(super) fn offset_target(&self, position: usize) -> Result<usize, CodecError> {
        let target = position
            .checked_add(self.u32(position)?)
            .filter(|target| *target < self.buf.len())
            .ok_or_else(|| invalid(format!("the offset at {position} points past the buffer")))?;
        Ok(target)
    }

    fn count(&mut self) -> Result<(), CodecError> {
        self.values += 1;
        if self.values > MAX_VALUES {
            return Err(invalid(format!(
                "the buffer decodes to more than {MAX_VALUES} values"
            )));
        }
        Ok(())
    }

    pub(super) fn depth(depth: usize) -> Result<usize, CodecError> {
        if depth >= MAX_DEPTH {
            return Err(invalid(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(depth + 1)
    }

    /// The table at `position`: each field present, or its default.
    pub(super) fn table(
        &mut self,
        object: usize,
        position: usize,
        depth: usize,
    ) -> Result<Value, CodecError> {
        let depth = Self::depth(depth)?;
        self.count()?;
        let definition = self.schema.object(object)?;
        let soffset = i32::from_le_bytes(self.bytes(position)?);
        let vtable = i64::try_from(position)
            .ok()
            .and_then(|position| position.checked_sub(i64::from(soffset)))
            .and_then(|vtable| usize::try_from(vtable).ok())
            .ok_or_else(|| invalid(format!("the table at {position} has no vtable")))?;
        let vtable_len = usize::from(self.u16(vtable)?);
        let table_len = usize::from(self.u16(vtable + 2)?);
        if vtable_len < 4 || vtable_len % 2 != 0 {
            return Err(invalid(format!("the vtable at {vtable} is malformed")));
        }
        let slot = |reader: &Self, offset: u16| -> Result<Option<usize>, CodecError> {
            let offset = usize::from(offset);
            if offset + 2 > vtable_len {
                return Ok(None);
            }
            match usize::from(reader.u16(vtable + offset)?) {
                0 => Ok(None),
                at if at >= table_len => Err(invalid(format!(
                    "a field of the table at {position} lies outside the table"
                ))),
                at => Ok(Some(position + at)),
            }
        };
        let mut map = Map::new();
        for field in &definition.fields {
            let at = slot(self, field.offset)?;
            let value = match (field.ty, at) {
                (Type::Scalar { scalar, enum_index }, Some(at)) => {
                    self.scalar(scalar, enum_index, at)?
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
                    let Some(type_field) = definition
                        .fields
                        .iter()
                        .find(|other| other.name == format!("{}_type", field.name))
                    else {
                        continue;
                    };
                    let Some(tag_at) = slot(self, type_field.offset)? else {
                        continue;
                    };
                    let tag = i64::from(self.bytes::<1>(tag_at)?[0]);
                    let member = self
                        .schema
                        .enums
                        .get(enum_index)
                        .and_then(|e| e.values.iter().find(|value| value.value == tag))
                        .and_then(|value| value.table);
                    match member {
                        Some(table) => {
                            let target = self.offset_target(at)?;
                            self.table(table, target, depth)?
                        }
                        None => continue,
                    }
                }
                (ty, Some(at)) => self.value(ty, at, depth)?,
            };
            map.insert(field.name.clone(), value);
        }
        Ok(Value::Object(map))
    }

    /// A non-scalar field's value stored at `at`.
    fn value(&mut self, ty: Type, at: usize, depth: usize) -> Result<Value, CodecError> {
        match ty {
            Type::String => {
                let target = self.offset_target(at)?;
                self.string(target)
            }
            Type::Object(object) => self.object(object, at, depth),
            Type::Vector(element) => {
                let target = self.offset_target(at)?;
                let len = self.u32(target)?;
                self.elements(element, target + 4, len, depth)
            }
            Type::Array(element, len) => self.elements(element, at, len, depth),
            Type::Scalar { scalar, enum_index } => self.scalar(scalar, enum_index, at),
            Type::Union(_) => Ok(Value::Null),
        }
    }

    fn elements(
        &mut self,
        element: Element,
        start: usize,
        len: usize,
        depth: usize,
    ) -> Result<Value, CodecError> {
        let depth = Self::depth(depth)?;
        let stride = match element {
            Element::Scalar { scalar, .. } => scalar.size(),
            Element::Object(object) if self.schema.is_struct(object) => {
                self.schema.object(object)?.bytesize.max(1)
            }
            Element::String | Element::Object(_) => 4,
        };
        // Checked up front, so a huge length in a small buffer fails at once.
        if len
            .checked_mul(stride)
            .and_then(|size| start.checked_add(size))
            .is_none_or(|end| end > self.buf.len())
        {
            return Err(invalid(format!(
                "a vector of {len} elements at {start} runs past the end of the buffer"
            )));
        }
        let mut items = Vec::with_capacity(len);
        for index in 0..len {
            let at = start + index * stride;
            self.count()?;
            items.push(match element {
                Element::Scalar { scalar, enum_index } => self.scalar(scalar, enum_index, at)?,
                Element::String => {
                    let target = self.offset_target(at)?;
                    self.string(target)?
                }
                Element::Object(object) => self.object(object, at, depth)?,
            });
        }
        Ok(Value::Array(items))
    }

    /// The struct stored inline at `at`, or the table the offset there points to.
    fn object(&mut self, object: usize, at: usize, depth: usize) -> Result<Value, CodecError> {
        if self.schema.is_struct(object) {
            return self.structure(object, at, depth);
        }
        let target = self.offset_target(at)?;
        self.table(object, target, depth)
    }

    /// A struct stored inline at `at`.
    fn structure(&mut self, object: usize, at: usize, depth: usize) -> Result<Value, CodecError> {
        let depth = Self::depth(depth)?;
        self.count()?;
        let definition = self.schema.object(object)?;
        let mut map = Map::new();
        for field in &definition.fields {
            let field_at = at + usize::from(field.offset);
            let value = self.value(field.ty, field_at, depth)?;
            map.insert(field.name.clone(), value);
        }
        Ok(Value::Object(map))
    }

    fn string(&mut self, at: usize) -> Result<Value, CodecError> {
        let len = self.u32(at)?;
        let bytes = (at + 4)
            .checked_add(len)
            .and_then(|end| self.buf.get(at + 4..end))
            .ok_or_else(|| invalid(format!("the string at {at} runs past the buffer")))?;
        std::str::from_utf8(bytes)
            .map(|text| Value::String(text.to_owned()))
            .map_err(|_| invalid(format!("the string at {at} is not UTF-8")))
    }

    fn scalar(
        &self,
        scalar: Scalar,
        enum_index: Option<usize>,
        at: usize,
    ) -> Result<Value, CodecError> {
        let integer = match scalar {
            Scalar::Bool => return Ok(Value::Bool(self.bytes::<1>(at)?[0] != 0)),
            Scalar::F32 => return Ok(float(f32::from_le_bytes(self.bytes(at)?).into(), true)),
            Scalar::F64 => return Ok(float(f64::from_le_bytes(self.bytes(at)?), false)),
            Scalar::U64 => {
                let value = u64::from_le_bytes(self.bytes(at)?);
                return Ok(match i64::try_from(value) {
                    Ok(signed) => self.integer(enum_index, signed),
                    Err(_) => Value::Number(value.into()),
                });
            }
            Scalar::I8 => i64::from(i8::from_le_bytes(self.bytes(at)?)),
            Scalar::U8 => i64::from(u8::from_le_bytes(self.bytes(at)?)),
            Scalar::I16 => i64::from(i16::from_le_bytes(self.bytes(at)?)),
            Scalar::U16 => i64::from(u16::from_le_bytes(self.bytes(at)?)),
            Scalar::I32 => i64::from(i32::from_le_bytes(self.bytes(at)?)),
            Scalar::U32 => i64::from(u32::from_le_bytes(self.bytes(at)?)),
            Scalar::I64 => i64::from_le_bytes(self.bytes(at)?),
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
