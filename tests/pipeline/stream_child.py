"""A driver that dies: runs a streaming query over the `ignis` format whose sink (a file of ids) gets half of
batch KILL_AT, and then SIGKILLs its whole process group (Python, the JVM, Spark's Python workers) — a
crashed node, not a polite stop. Used by test_stream.py.

    python stream_child.py STORE_URL CHECKPOINT SINK_FILE KILL_AT
"""

from __future__ import annotations

import os
import signal
import sys

from ignis_pipeline.session import build_session


def main() -> None:
    store, checkpoint, sink, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    spark = build_session("ignis-kill-child", "local[2]", {"spark.ui.enabled": "false",
                                                           "spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")

    def handle(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        ids = [r.id for r in df.select("id").collect()]
        with open(sink, "a") as out:
            if batch_id == kill_at:
                out.write("".join(f"{i}\n" for i in ids[: len(ids) // 2]))
                out.flush()
                os.fsync(out.fileno())
                os.killpg(0, signal.SIGKILL)  # mid-batch: the batch is in the offset log, not committed
            out.write("".join(f"{i}\n" for i in ids))

    stream = (spark.readStream.format("ignis").option("store", store).option("queue", "events")
              .option("maxMessagesPerTrigger", 100).load())
    query = (stream.writeStream.foreachBatch(handle).option("checkpointLocation", checkpoint)
             .trigger(processingTime="100 milliseconds").start())
    query.awaitTermination(180)
    sys.exit(3)  # never reached when the kill happens


if __name__ == "__main__":
    main()
