//! FlatBuffers stream schema (`schema = "flat_buffer"`): one buffer per Iggy
//! message whose root is one table type. The types come from a binary schema
//! (`.bfbs`, written by `flatc -b --schema FILE.fbs`), read once at load.
//!
//! Sinks decode a buffer into JSON the way `flatc --json --defaults-json`
//! prints it: fields in declaration order, scalars absent from the buffer
//! given their schema default (optional scalars as `null`), enums by name,
//! unions as `{field}_type` (the member's name, `NONE` when unset) and
//! `{field}` (the table), structs and fixed arrays as objects and arrays,
//! non-finite floats as the strings `"NaN"`, `"Infinity"` and `"-Infinity"`. Every read is bounds
//! checked: a buffer that does not fit the schema fails that message.
//!
//! A buffer's file identifier is not checked (writers may leave it out);
//! encoding writes the schema's.
//!
//! Sources encode JSON into one buffer: tables, scalars, enums (by name or
//! value), strings, vectors of scalars, strings and tables, and unions.
//! Structs cannot be encoded (a message holding one fails with a message
//! naming it); decoding supports them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use flatbuffers::{FlatBufferBuilder, TableFinishedWIPOffset, WIPOffset};
use flatbuffers_reflection::reflection::{self, BaseType};
use serde_json::{Map, Number, Value};

use super::CodecError;
use crate::message::Payload;

/// Nesting of tables, vectors and structs a buffer may have.
const MAX_DEPTH: usize = 64;
/// Values one buffer may decode to: offsets may point many times at the same
/// table, so a small buffer could otherwise expand without bound.
const MAX_VALUES: usize = 1_000_000;

/// One root table type of a binary schema, ready to decode and encode.
#[derive(Clone)]
pub struct FlatBufferCodec {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    root: usize,
    objects: Vec<ObjectDef>,
    enums: Vec<EnumDef>,
    file_identifier: Option<String>,
}

struct ObjectDef {
    name: String,
    is_struct: bool,
    bytesize: usize,
    /// In declaration order (the schema stores them sorted by name).
    fields: Vec<FieldDef>,
}

struct FieldDef {
    name: String,
    ty: Type,
    /// A table field's vtable slot, or a struct field's byte offset.
    offset: u16,
    default_integer: i64,
    default_real: f64,
    required: bool,
    optional: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scalar {
    Bool,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
}

/// What a field, a vector element or an array element holds. `enum_index`
/// names the enum of a scalar, or of a union's type field.
#[derive(Clone, Copy, Debug)]
enum Type {
    Scalar {
        scalar: Scalar,
        enum_index: Option<usize>,
    },
    String,
    /// A table, or a struct (stored inline): see [`Inner::is_struct`].
    Object(usize),
    Union(usize),
    Vector(Element),
    Array(Element, usize),
}

#[derive(Clone, Copy, Debug)]
enum Element {
    Scalar {
        scalar: Scalar,
        enum_index: Option<usize>,
    },
    String,
    Object(usize),
}

struct EnumDef {
    values: Vec<EnumValue>,
}

struct EnumValue {
    value: i64,
    name: String,
    /// For a union member: the table it holds.
    table: Option<usize>,
}

impl FlatBufferCodec {
    /// Loads the table `root_table` (a full name such as `shop.v1.Order` or
    /// the bare name) from the binary schema at `path`; without a name, the
    /// schema's `root_type`.
    pub fn load(path: &Path, root_table: Option<&str>) -> Result<Self, String> {
        if path.extension().is_some_and(|extension| extension == "fbs") {
            return Err(format!(
                "{} is a schema source; give the binary schema flatc writes from it: \
                 flatc -b --schema {}",
                path.display(),
                path.display()
            ));
        }
        let bytes = std::fs::read(path)
            .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        let schema = reflection::root_as_schema(&bytes).map_err(|error| {
            format!(
                "{} is not a FlatBuffers binary schema (.bfbs): {error}",
                path.display()
            )
        })?;
        let objects: Vec<ObjectDef> = schema
            .objects()
            .iter()
            .map(|object| read_object(&object))
            .collect::<Result<_, _>>()?;
        let enums = schema.enums().iter().map(|e| read_enum(&e)).collect();
        let root = match root_table {
            Some(name) => {
                let name = name.trim_start_matches('.');
                objects
                    .iter()
                    .position(|object| {
                        !object.is_struct
                            && (object.name == name || object.name.rsplit('.').next() == Some(name))
                    })
                    .ok_or_else(|| {
                        let tables: Vec<_> = objects
                            .iter()
                            .filter(|object| !object.is_struct)
                            .map(|object| object.name.as_str())
                            .collect();
                        format!(
                            "table \"{name}\" is not defined; defined: {}",
                            tables.join(", ")
                        )
                    })?
            }
            None => {
                let root = schema.root_table().ok_or_else(|| {
                    format!(
                        "{} has no root_type; name the table with root_table_name",
                        path.display()
                    )
                })?;
                objects
                    .iter()
                    .position(|object| object.name == root.name())
                    .ok_or("the schema's root_type is not among its objects")?
            }
        };
        let file_identifier = schema
            .file_ident()
            .filter(|ident| ident.len() == 4)
            .map(str::to_owned);
        Ok(Self {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                root,
                objects,
                enums,
                file_identifier,
            }),
        })
    }

    /// The root table's full name.
    pub fn root_table(&self) -> &str {
        &self.inner.objects[self.inner.root].name
    }

    /// Decodes one buffer into JSON.
    pub fn decode(&self, bytes: &[u8]) -> Result<Payload, CodecError> {
        let inner = &self.inner;
        if bytes.len() < 8 {
            return Err(invalid(format!(
                "a buffer of {} bytes is too short to hold a table",
                bytes.len()
            )));
        }
        let mut reader = Reader {
            buf: bytes,
            schema: inner,
            values: 0,
        };
        let root = reader.offset_target(0)?;
        reader.table(inner.root, root, 0).map(Payload::Json)
    }

    /// Encodes JSON (a value, JSON text, or text holding JSON) as one buffer;
    /// raw bytes must already be one buffer of this type and are stored as
    /// they are.
    pub fn encode(&self, payload: &Payload) -> Result<Bytes, CodecError> {
        let parsed;
        let value = match payload {
            Payload::Json(value) => value,
            Payload::JsonBytes(bytes) => {
                parsed = parse_json(bytes)?;
                &parsed
            }
            Payload::Text(text) => {
                parsed = parse_json(text.as_bytes())?;
                &parsed
            }
            Payload::Raw(bytes) => {
                self.decode(bytes)?;
                return Ok(bytes.clone());
            }
        };
        let mut builder = FlatBufferBuilder::with_capacity(256);
        let mut writer = Writer {
            schema: &self.inner,
            builder: &mut builder,
        };
        let root = writer.table(self.inner.root, value, 0)?;
        builder.finish(root, self.inner.file_identifier.as_deref());
        Ok(Bytes::copy_from_slice(builder.finished_data()))
    }
}

fn parse_json(bytes: &[u8]) -> Result<Value, CodecError> {
    serde_json::from_slice(bytes).map_err(|error| CodecError::InvalidJson(error.to_string()))
}

fn invalid(message: impl Into<String>) -> CodecError {
    CodecError::InvalidFlatBuffer(message.into())
}

fn read_object(object: &reflection::Object) -> Result<ObjectDef, String> {
    let mut fields: Vec<(u16, FieldDef)> = Vec::new();
    for field in object.fields().iter().filter(|field| !field.deprecated()) {
        let ty = read_type(&field.type_()).map_err(|kind| {
            format!(
                "field {}.{} has a type iggy-connect cannot read ({kind})",
                object.name(),
                field.name()
            )
        })?;
        fields.push((
            field.id(),
            FieldDef {
                name: field.name().to_owned(),
                ty,
                offset: field.offset(),
                default_integer: field.default_integer(),
                default_real: field.default_real(),
                required: field.required(),
                optional: field.optional(),
            },
        ));
    }
    fields.sort_by_key(|(id, _)| *id);
    Ok(ObjectDef {
        name: object.name().to_owned(),
        is_struct: object.is_struct(),
        bytesize: usize::try_from(object.bytesize()).unwrap_or(0),
        fields: fields.into_iter().map(|(_, field)| field).collect(),
    })
}

fn read_enum(definition: &reflection::Enum) -> EnumDef {
    let values = definition
        .values()
        .iter()
        .map(|value| EnumValue {
            value: value.value(),
            name: value.name().to_owned(),
            table: value
                .union_type()
                .filter(|ty| ty.base_type() == BaseType::Obj)
                .and_then(|ty| usize::try_from(ty.index()).ok()),
        })
        .collect();
    EnumDef { values }
}

fn read_type(ty: &reflection::Type) -> Result<Type, String> {
    let index = usize::try_from(ty.index()).ok();
    let element = |base: BaseType| -> Result<Element, String> {
        Ok(match base {
            BaseType::String => Element::String,
            BaseType::Obj => Element::Object(index.ok_or("object without an index")?),
            other => Element::Scalar {
                scalar: scalar(other)?,
                enum_index: index,
            },
        })
    };
    Ok(match ty.base_type() {
        BaseType::String => Type::String,
        BaseType::Obj => Type::Object(index.ok_or("object without an index")?),
        BaseType::Union => Type::Union(index.ok_or("union without an index")?),
        BaseType::Vector => Type::Vector(element(ty.element())?),
        BaseType::Array => Type::Array(element(ty.element())?, usize::from(ty.fixed_length())),
        BaseType::Vector64 => return Err("64-bit vectors".into()),
        other => Type::Scalar {
            scalar: scalar(other)?,
            enum_index: index,
        },
    })
}

fn scalar(base: BaseType) -> Result<Scalar, String> {
    Ok(match base {
        BaseType::Bool => Scalar::Bool,
        BaseType::Byte => Scalar::I8,
        BaseType::UByte | BaseType::UType => Scalar::U8,
        BaseType::Short => Scalar::I16,
        BaseType::UShort => Scalar::U16,
        BaseType::Int => Scalar::I32,
        BaseType::UInt => Scalar::U32,
        BaseType::Long => Scalar::I64,
        BaseType::ULong => Scalar::U64,
        BaseType::Float => Scalar::F32,
        BaseType::Double => Scalar::F64,
        other => return Err(format!("base type {other:?}")),
    })
}

impl Scalar {
    fn size(self) -> usize {
        match self {
            Scalar::Bool | Scalar::I8 | Scalar::U8 => 1,
            Scalar::I16 | Scalar::U16 => 2,
            Scalar::I32 | Scalar::U32 | Scalar::F32 => 4,
            Scalar::I64 | Scalar::U64 | Scalar::F64 => 8,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Scalar::F32 | Scalar::F64)
    }
}

impl Inner {
    fn is_struct(&self, index: usize) -> bool {
        self.objects
            .get(index)
            .is_some_and(|object| object.is_struct)
    }

    fn object(&self, index: usize) -> Result<&ObjectDef, CodecError> {
        self.objects
            .get(index)
            .ok_or_else(|| invalid("the schema names an object it does not define"))
    }

    fn enum_name(&self, enum_index: Option<usize>, value: i64) -> Option<&str> {
        let definition = self.enums.get(enum_index?)?;
        definition
            .values
            .iter()
            .find(|candidate| candidate.value == value)
            .map(|candidate| candidate.name.as_str())
    }

    fn enum_value(&self, enum_index: usize, name: &str) -> Option<&EnumValue> {
        self.enums
            .get(enum_index)?
            .values
            .iter()
            .find(|candidate| candidate.name == name)
    }
}

/// Bounds-checked reads of one buffer, guided by the schema.
struct Reader<'a> {
    buf: &'a [u8],
    schema: &'a Inner,
    values: usize,
}

impl Reader<'_> {
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
    fn offset_target(&self, position: usize) -> Result<usize, CodecError> {
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

    fn depth(depth: usize) -> Result<usize, CodecError> {
        if depth >= MAX_DEPTH {
            return Err(invalid(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(depth + 1)
    }

    /// The table at `position`: each field present, or its default.
    fn table(&mut self, object: usize, position: usize, depth: usize) -> Result<Value, CodecError> {
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

/// Builds one buffer from JSON, guided by the schema.
struct Writer<'s, 'b, 'f> {
    schema: &'s Inner,
    builder: &'b mut FlatBufferBuilder<'f>,
}

impl Writer<'_, '_, '_> {
    fn table(
        &mut self,
        object: usize,
        value: &Value,
        depth: usize,
    ) -> Result<WIPOffset<TableFinishedWIPOffset>, CodecError> {
        let depth = Reader::depth(depth)?;
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
        let depth = Reader::depth(depth)?;
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

impl Scalar {
    fn name(self) -> &'static str {
        match self {
            Scalar::Bool => "bool",
            Scalar::I8 => "byte",
            Scalar::U8 => "ubyte",
            Scalar::I16 => "short",
            Scalar::U16 => "ushort",
            Scalar::I32 => "int",
            Scalar::U32 => "uint",
            Scalar::I64 => "long",
            Scalar::U64 => "ulong",
            Scalar::F32 => "float",
            Scalar::F64 => "double",
        }
    }
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

impl PartialEq for FlatBufferCodec {
    fn eq(&self, other: &Self) -> bool {
        self.inner.path == other.inner.path && self.root_table() == other.root_table()
    }
}

impl Eq for FlatBufferCodec {}

impl std::fmt::Debug for FlatBufferCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlatBufferCodec")
            .field("path", &self.inner.path)
            .field("root_table", &self.root_table())
            .finish()
    }
}
