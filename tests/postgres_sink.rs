mod postgres_common;
