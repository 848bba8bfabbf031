-- Scenario 2: statistics fitted in the same query, image decode -> resize -> tensor.
-- sqlfeed --target-partitions 2 -f examples/sql/02_preprocess.sql
WITH stats AS (SELECT avg(f0) AS m0, stddev(f0) AS s0 FROM 'data/*.parquet')
SELECT count(*) AS rows,
       avg(standardize(f0, m0, s0)) AS mean_after,
       stddev(standardize(f0, m0, s0)) AS std_after,
       max(cardinality(image_to_tensor(image_resize(image_decode(image_jpeg), 24, 24))['values'])) AS image_elems
FROM 'data/*.parquet' CROSS JOIN stats;
