-- Scenario 7: preprocess once, reuse across queries and runs.
-- sqlfeed -f examples/sql/07_cache.sql   (run it twice: the second run reuses the entry)
CACHE TABLE train AS
  SELECT image_to_tensor(image_resize(image_decode(image_jpeg), 24, 24)) AS image, label
  FROM 'data/*.parquet';
SELECT label, count(*) AS n FROM train GROUP BY label ORDER BY label;
\cache
