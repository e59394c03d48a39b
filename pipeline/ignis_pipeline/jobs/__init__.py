"""The pipeline jobs, each a function over a SparkSession (used by `ignis pipeline ...`) and a module that
`spark-submit` can run:

    JOB=$(python -c 'import ignis_pipeline.jobs.export as m; print(m.__file__)')
    IGNIS_STORE=aerospike://aero:3000/ignis spark-submit --master spark://host:7077 "$JOB" orders --to s3a://b/orders

* `export`  — queue magazines to Parquet (or JSON), partitioned by queue and magazine;
* `replay`  — an export back into a queue, ids and headers kept, with a rate cap and a canary gate;
* `redrive` — dead letters or sidelined messages back to main, selected by SQL, each moved once;
* `stats`   — backlog analytics, optionally drawn as a PNG.
"""
