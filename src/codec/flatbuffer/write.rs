//! Encoding: one buffer built from JSON, guided by the schema.

use flatbuffers::{FlatBufferBuilder, TableFinishedWIPOffset, WIPOffset};
use serde_json::{Map, Value};

use super::{Element, FieldDef, Inner, ObjectDef, Scalar, Type, deeper, invalid};
use crate::codec::CodecError;

/// Builds one buffer from JSON, guided by the schema.
pub(super) struct Writer<'s, 'b, 'f> {
    schema: &'s Inner,
    builder: &'b mut FlatBufferBuilder<'f>,
}

impl<'s, 'b, 'f> Writer<'s, 'b, 'f> {
    pub(super) fn new(schema: &'s Inner, builder: &'b mut FlatBufferBuilder<'f>) -> Self {
        Self { schema, builder }
    }

    pub(super) fn table(
        &mut self,
        object: usize,
        value: &Value,
        depth: usize,
    ) -> Result<WIPOffset<TableFinishedWIPOffset>, CodecError> {
        let depth = deeper(depth)?;
        let definition = self.schema.object(object)?;
        let Some(map) = value.as_object() else {
            return Err(invalid(format!(
                "expected an object for table {}, found {value}",
                definition.name
            )));
        };
        if let Some(unknown) = map
            .keys()
            .find(|key| !definition.fields.iter().any(|field| &field.name == *key))
        {
            return Err(invalid(format!(
                "table {} has no field \"{unknown}\"",
                definition.name
            )));
        }
        // Everything a table points to is written before the table itself.
        let mut offsets = Vec::new();
        for field in &definition.fields {
            let Some(value) = map.get(&field.name).filter(|value| !value.is_null()) else {
                if field.required {
                    return Err(invalid(format!(
                        "required field {}.{} is missing",
                        definition.name, field.name
                    )));
                }
                continue;
            };
            let context = || format!("{}.{}", definition.name, field.name);
            let offset = match field.ty {
                Type::Scalar { .. } => continue,
                Type::String => {
                    let text = value.as_str().ok_or_else(|| {
                        invalid(format!("{} expects a string, found {value}", context()))
                    })?;
                    self.builder.create_string(text).value()
                }
                Type::Object(index) if self.schema.is_struct(index) => {
                    return Err(struct_refused(&context(), self.schema, index));
                }
                Type::Object(index) => self.table(index, value, depth)?.value(),
                Type::Union(enum_index) => {
                    let member = self.union_member(definition, field, map, enum_index)?;
                    self.table(member, value, depth)?.value()
                }
                Type::Vector(element) => self.vector(element, value, &context(), depth)?,
                Type::Array(..) => {
                    return Err(invalid(format!(
                        "{} is a fixed-size array, which only structs hold",
                        context()
                    )));
                }
            };
            offsets.push((field.offset, offset));
        }
        let start = self.builder.start_table();
        for (slot, offset) in offsets {
            self.builder
                .push_slot_always(slot, WIPOffset::<()>::new(offset));
        }
        for field in &definition.fields {
            let Type::Scalar { scalar, enum_index } = field.ty else {
                continue;
            };
            let Some(value) = map.get(&field.name).filter(|value| !value.is_null()) else {
                continue;
            };
            let context = format!("{}.{}", definition.name, field.name);
            let scalar_value = self.scalar_value(scalar, enum_index, value, &context)?;
            scalar_value.push(self.builder, field.offset);
        }
        Ok(self.builder.end_table(start))
    }

    /// The member table a union field holds, from its `{field}_type` value.
    fn union_member(
        &self,
        definition: &ObjectDef,
        field: &FieldDef,
        map: &Map<String, Value>,
        enum_index: usize,
    ) -> Result<usize, CodecError> {
        let type_name = format!("{}_type", field.name);
        let tag = map.get(&type_name).ok_or_else(|| {
            invalid(format!(
                "{}.{} needs {type_name} to say which member it holds",
                definition.name, field.name
            ))
        })?;
        let member = match tag {
            Value::String(name) => self.schema.enum_value(enum_index, name),
            Value::Number(number) => number.as_i64().and_then(|value| {
                self.schema
                    .enums
                    .get(enum_index)?
                    .values
                    .iter()
                    .find(|candidate| candidate.value == value)
            }),
            _ => None,
        };
        member.and_then(|member| member.table).ok_or_else(|| {
            invalid(format!(
                "{}.{type_name} is not a member of the union: {tag}",
                definition.name
            ))
        })
    }

    /// A vector, returned as the offset value the table stores.
    fn vector(
        &mut self,
        element: Element,
        value: &Value,
        context: &str,
        depth: usize,
    ) -> Result<u32, CodecError> {
        let depth = deeper(depth)?;
        let Some(items) = value.as_array() else {
            return Err(invalid(format!(
                "{context} expects an array, found {value}"
            )));
        };
        let offset = match element {
            Element::Scalar { scalar, enum_index } => {
                let values = items
                    .iter()
                    .map(|item| self.scalar_value(scalar, enum_index, item, context))
                    .collect::<Result<Vec<_>, _>>()?;
                ScalarValue::vector(self.builder, scalar, &values)
            }
            Element::String => {
                let mut offsets = Vec::with_capacity(items.len());
                for item in items {
                    let text = item.as_str().ok_or_else(|| {
                        invalid(format!("{context} expects strings, found {item}"))
                    })?;
                    offsets.push(self.builder.create_string(text));
                }
                self.builder.create_vector(&offsets).value()
            }
            Element::Object(index) if self.schema.is_struct(index) => {
                return Err(struct_refused(context, self.schema, index));
            }
            Element::Object(index) => {
                let mut offsets = Vec::with_capacity(items.len());
                for item in items {
                    offsets.push(self.table(index, item, depth)?);
                }
                self.builder.create_vector(&offsets).value()
            }
        };
        Ok(offset)
    }

    fn scalar_value(
        &self,
        scalar: Scalar,
        enum_index: Option<usize>,
        value: &Value,
        context: &str,
    ) -> Result<ScalarValue, CodecError> {
        let mismatch = || {
            invalid(format!(
                "{context} expects a {} value, found {value}",
                scalar.name()
            ))
        };
        if scalar == Scalar::Bool {
            return value.as_bool().map(ScalarValue::Bool).ok_or_else(mismatch);
        }
        if scalar.is_float() {
            let number = match value {
                Value::Number(number) => number.as_f64(),
                Value::String(text) => match text.as_str() {
                    "NaN" => Some(f64::NAN),
                    "Infinity" => Some(f64::INFINITY),
                    "-Infinity" => Some(f64::NEG_INFINITY),
                    _ => None,
                },
                _ => None,
            }
            .ok_or_else(mismatch)?;
            return Ok(if scalar == Scalar::F32 {
                ScalarValue::F32(number as f32)
            } else {
                ScalarValue::F64(number)
            });
        }
        let integer: i128 = match value {
            Value::Number(number) => number
                .as_i64()
                .map(i128::from)
                .or_else(|| number.as_u64().map(i128::from))
                .ok_or_else(mismatch)?,
            Value::String(name) => enum_index
                .and_then(|index| self.schema.enum_value(index, name))
                .map(|value| i128::from(value.value))
                .ok_or_else(mismatch)?,
            _ => return Err(mismatch()),
        };
        ScalarValue::integer(scalar, integer).ok_or_else(|| {
            invalid(format!(
                "{context} is a {}; {integer} is out of its range",
                scalar.name()
            ))
        })
    }
}

fn struct_refused(context: &str, schema: &Inner, index: usize) -> CodecError {
    let name = schema
        .objects
        .get(index)
        .map_or("?", |object| object.name.as_str());
    invalid(format!(
        "{context} is the struct {name}: iggy-connect decodes FlatBuffers structs but cannot \
         encode them"
    ))
}

/// One scalar ready to be written with its own width.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ScalarValue {
    Bool(bool),
    I8(i8),
    U8(u8),
    I16(i16),
    U16(u16),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
}

impl ScalarValue {
    fn integer(scalar: Scalar, value: i128) -> Option<Self> {
        Some(match scalar {
            Scalar::I8 => ScalarValue::I8(value.try_into().ok()?),
            Scalar::U8 => ScalarValue::U8(value.try_into().ok()?),
            Scalar::I16 => ScalarValue::I16(value.try_into().ok()?),
            Scalar::U16 => ScalarValue::U16(value.try_into().ok()?),
            Scalar::I32 => ScalarValue::I32(value.try_into().ok()?),
            Scalar::U32 => ScalarValue::U32(value.try_into().ok()?),
            Scalar::I64 => ScalarValue::I64(value.try_into().ok()?),
            Scalar::U64 => ScalarValue::U64(value.try_into().ok()?),
            Scalar::Bool | Scalar::F32 | Scalar::F64 => return None,
        })
    }

    /// Writes the value into the table being built, always (so an optional
    /// scalar set to its default still reads as set).
    fn push(self, builder: &mut FlatBufferBuilder, slot: u16) {
        match self {
            ScalarValue::Bool(value) => builder.push_slot_always(slot, value),
            ScalarValue::I8(value) => builder.push_slot_always(slot, value),
            ScalarValue::U8(value) => builder.push_slot_always(slot, value),
            ScalarValue::I16(value) => builder.push_slot_always(slot, value),
            ScalarValue::U16(value) => builder.push_slot_always(slot, value),
            ScalarValue::I32(value) => builder.push_slot_always(slot, value),
            ScalarValue::U32(value) => builder.push_slot_always(slot, value),
            ScalarValue::I64(value) => builder.push_slot_always(slot, value),
            ScalarValue::U64(value) => builder.push_slot_always(slot, value),
            ScalarValue::F32(value) => builder.push_slot_always(slot, value),
            ScalarValue::F64(value) => builder.push_slot_always(slot, value),
        }
    }

    /// A vector of scalars of one type, as the offset value a table stores.
    fn vector(builder: &mut FlatBufferBuilder, scalar: Scalar, values: &[Self]) -> u32 {
        macro_rules! typed {
            ($variant:ident) => {{
                let typed: Vec<_> = values
                    .iter()
                    .filter_map(|value| match value {
                        ScalarValue::$variant(value) => Some(*value),
                        _ => None,
                    })
                    .collect();
                builder.create_vector(&typed).value()
            }};
        }
        match scalar {
            Scalar::Bool => typed!(Bool),
            Scalar::I8 => typed!(I8),
            Scalar::U8 => typed!(U8),
            Scalar::I16 => typed!(I16),
            Scalar::U16 => typed!(U16),
            Scalar::I32 => typed!(I32),
            Scalar::U32 => typed!(U32),
            Scalar::I64 => typed!(I64),
            Scalar::U64 => typed!(U64),
            Scalar::F32 => typed!(F32),
            Scalar::F64 => typed!(F64),
        }
    }
}
