defmodule MiElixirPlain do
  @moduledoc "Nothing: the release is the point."
  def hello, do: :world
end
