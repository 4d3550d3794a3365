//! One commit attempt on exactly the table state the offset markers were
//! read from.
//!
//! `Transaction::commit` reloads the table before applying its actions and,
//! on a retryable conflict, reloads and applies them again: either would
//! append the buffered rows onto a table that may meanwhile hold some of
//! them (a commit that timed out for this sink but landed, another instance
//! of the connector). Through this catalog the transaction sees the table
//! the markers came from, and a conflict comes back to the sink as an
//! error, not retried: the sink's next attempt reads the markers again.

use std::collections::HashMap;

use async_trait::async_trait;
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, Namespace, NamespaceIdent, Result, TableCommit, TableCreation, TableIdent,
};

#[derive(Debug)]
pub struct Pinned<'a> {
    pub inner: &'a dyn Catalog,
    pub table: Table,
}

#[async_trait]
impl Catalog for Pinned<'_> {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        self.inner.list_namespaces(parent).await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        self.inner.create_namespace(namespace, properties).await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        self.inner.get_namespace(namespace).await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        self.inner.namespace_exists(namespace).await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        self.inner.update_namespace(namespace, properties).await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        self.inner.drop_namespace(namespace).await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        self.inner.list_tables(namespace).await
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> Result<Table> {
        self.inner.create_table(namespace, creation).await
    }

    async fn load_table(&self, table: &TableIdent) -> Result<Table> {
        if table == self.table.identifier() {
            return Ok(self.table.clone());
        }
        self.inner.load_table(table).await
    }

    async fn drop_table(&self, table: &TableIdent) -> Result<()> {
        self.inner.drop_table(table).await
    }

    async fn purge_table(&self, table: &TableIdent) -> Result<()> {
        self.inner.purge_table(table).await
    }

    async fn table_exists(&self, table: &TableIdent) -> Result<bool> {
        self.inner.table_exists(table).await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> Result<()> {
        self.inner.rename_table(src, dest).await
    }

    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> Result<Table> {
        self.inner.register_table(table, metadata_location).await
    }

    async fn update_table(&self, commit: TableCommit) -> Result<Table> {
        // The same error, not marked retryable: the transaction gives up.
        self.inner.update_table(commit).await.map_err(|error| {
            let kind = error.kind();
            let message = error.to_string();
            Error::new(kind, message).with_source(error)
        })
    }
}
