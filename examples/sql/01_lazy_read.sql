-- Scenario 1: schema and first row without reading the dataset.
-- sqlfeed gen --rows 20000 --out data && sqlfeed -f examples/sql/01_lazy_read.sql
DESCRIBE 'data/*.parquet';
SELECT id, label, caption FROM 'data/*.parquet' LIMIT 1;
