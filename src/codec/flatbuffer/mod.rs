//! FlatBuffers stream schema (`schema = "flat_buffer"`): one buffer per Iggy
//! message whose root is one table type. The types come from a binary schema
//! (`.bfbs`, written by `flatc -b --schema FILE.fbs`), read once at load.
//!
//! Sinks decode a buffer into JSON the way `flatc --json --defaults-json`
//! prints it: fields in declaration order, scalars absent from the buffer
//! given their schema default (optional scalars as `null`), enums by name,
//! unions as `{field}_type` (the member's name, `NONE` when unset) and
//! `{field}` (the table), structs and fixed arrays as objects and arrays,
//! non-finite floats as the strings `"NaN"`, `"Infinity"` and `"-Infinity"`. The
//! `flatbuffers` crate's verifier checks every part before it is read: a
//! buffer that does not fit the schema fails that message.
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
use flatbuffers::FlatBufferBuilder;
use flatbuffers_reflection::reflection::{self, BaseType};
use serde_json::Value;

use super::CodecError;
use crate::message::Payload;

mod read;
mod write;

use write::Writer;

/// Nesting of tables a buffer may have (of tables and vectors when encoding).
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
        read::decode(bytes, inner).map(Payload::Json)
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
        let mut writer = Writer::new(&self.inner, &mut builder);
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

/// One level below `depth`, refused past [`MAX_DEPTH`].
fn deeper(depth: usize) -> Result<usize, CodecError> {
    if depth >= MAX_DEPTH {
        return Err(invalid(format!("nested deeper than {MAX_DEPTH} levels")));
    }
    Ok(depth + 1)
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
